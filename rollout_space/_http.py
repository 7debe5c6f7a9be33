"""One JSON request to another Space, its failures turned into errors that say what to check."""

from __future__ import annotations

from typing import Any

import httpx


def request_json(http: httpx.Client, method: str, path: str, body: dict[str, Any] | None, *, what: str,
                 flag: str, error: type[Exception]) -> Any:
    """`method path` with a JSON body; the answer's JSON.

    Args:
        what: The other side, for messages ("the env Space at http://...").
        flag: The setting that points at it ("--env-url"), named when it does not answer.
        error: Raised on failure.
    """
    try:
        response = http.request(method, path, json=body)
    except httpx.HTTPError as e:
        raise error(f"{what} did not answer {path}: {e}; check that it runs and that {flag} points at it") from e
    if response.status_code != 200:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise error(f"{what} refused {path} (HTTP {response.status_code}): {detail}")
    return response.json()
