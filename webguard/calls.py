"""One JSON request to another Space, its reply bounded in size and time (`delta.replies.read_reply`), its failures
turned into errors that say what to check."""

from __future__ import annotations

import json
import math
import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from delta.replies import ReplyLimitError, read_reply

Answer = TypeVar("Answer", bound=BaseModel)

#: Statuses that say the request itself is wrong (a token, a cap, a body the server does not take): asking
#: again cannot succeed. Anything else may pass on a later try: 408, 409, 429, 5xx, and 404 too, which a
#: hosting proxy may answer while a Space restarts.
REFUSALS = frozenset({400, 401, 403, 413, 422})


def exchange(
    http: httpx.Client, method: str, path: str, body: dict[str, Any] | None, max_bytes: int
) -> tuple[int, bytes]:
    """`method path` with a JSON body: the reply's status and body, read whole within the client's timeout (which
    bounds each read and the whole reply; a client without one waits as long as it takes) and `max_bytes`. Asks for no
    compression: what arrives is what is counted.

    Raises:
        httpx.HTTPError: no answer.
        delta.ReplyLimitError: a reply over `max_bytes`, or still coming at the deadline.
    """
    deadline = time.monotonic() + (math.inf if http.timeout.read is None else http.timeout.read)
    with http.stream(method, path, json=body, headers={"Accept-Encoding": "identity"}) as response:
        return response.status_code, read_reply(response.iter_bytes(), max_bytes=max_bytes, deadline=deadline)


def request_json(
    http: httpx.Client,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    *,
    what: str,
    flag: str,
    error: type[Exception],
    answer: type[Answer],
    max_bytes: int,
    refused: type[Exception] | None = None,
) -> Answer:
    """`method path` with a JSON body; the answer parsed as `answer` (`exchange`: within the client's timeout and
    `max_bytes`).

    Args:
        what: The other side, for messages ("the env Space at http://...").
        flag: The setting that points at it ("--env-url"), named when it does not answer.
        error: Raised on failure: no answer, an HTTP error, a reply over the bounds, or an answer that is not an
            `answer`.
        answer: The model of the answer.
        max_bytes: Most bytes of the reply.
        refused: Raised instead of `error` for a status in `REFUSALS` (default: `error`), so callers that
            retry can tell a request that will never pass from a server that is down.
    """
    try:
        status, content = exchange(http, method, path, body, max_bytes)
    except httpx.HTTPError as e:
        raise error(f"{what} did not answer {path}: {e}; check that it runs and that {flag} points at it") from e
    except ReplyLimitError as e:
        raise error(f"{what} answered {path} with {e}: refused; check that {flag} points at this project's app") from e
    if status != 200:
        text = content.decode(errors="replace")
        try:
            refusal = json.loads(content)
        except ValueError:
            refusal = None
        detail = refusal.get("detail", text) if isinstance(refusal, dict) else text
        kind = refused if refused is not None and status in REFUSALS else error
        raise kind(f"{what} refused {path} (HTTP {status}): {detail}")
    try:
        return answer.model_validate_json(content)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise error(
            f"{what} answered {path} with something that is not a {answer.__name__} ({where}: "
            f"{first['msg']}); check that {flag} points at this project's app, of the same version"
        ) from e
