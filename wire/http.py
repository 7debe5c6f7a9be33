"""One JSON request to another Space, its failures turned into errors that say what to check."""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

Answer = TypeVar("Answer", bound=BaseModel)

#: Statuses that say the request itself is wrong (a token, a cap, a body the server does not take): asking
#: again cannot succeed. Anything else may pass on a later try: 408, 409, 429, 5xx, and 404 too, which a
#: hosting proxy may answer while a Space restarts.
REFUSALS = frozenset({400, 401, 403, 413, 422})


def request_json(http: httpx.Client, method: str, path: str, body: dict[str, Any] | None, *, what: str,
                 flag: str, error: type[Exception], answer: type[Answer],
                 refused: type[Exception] | None = None) -> Answer:
    """`method path` with a JSON body; the answer parsed as `answer`.

    Args:
        what: The other side, for messages ("the env Space at http://...").
        flag: The setting that points at it ("--env-url"), named when it does not answer.
        error: Raised on failure: no answer, an HTTP error, or an answer that is not an `answer`.
        answer: The model of the answer.
        refused: Raised instead of `error` for a status in `REFUSALS` (default: `error`), so callers that
            retry can tell a request that will never pass from a server that is down.
    """
    try:
        response = http.request(method, path, json=body)
    except httpx.HTTPError as e:
        raise error(f"{what} did not answer {path}: {e}; check that it runs and that {flag} points at it") from e
    if response.status_code != 200:
        try:
            refusal = response.json()
        except ValueError:
            refusal = None
        detail = refusal.get("detail", response.text) if isinstance(refusal, dict) else response.text
        kind = refused if refused is not None and response.status_code in REFUSALS else error
        raise kind(f"{what} refused {path} (HTTP {response.status_code}): {detail}")
    try:
        return answer.model_validate_json(response.content)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise error(f"{what} answered {path} with something that is not a {answer.__name__} ({where}: "
                    f"{first['msg']}); check that {flag} points at this project's app, of the same version") from e
