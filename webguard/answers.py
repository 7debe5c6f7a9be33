"""The one shape of every refusal the three apps answer: ``{"detail": "<one line>", "error": "<class>"}``.

A client reads ``detail`` as text and ``error`` as the kind of refusal, whichever app answered and whatever went
wrong: a body that is not JSON, a field of the wrong type, a body over the size limit, a missing token, an unknown
route, or an app's own error (its class name). FastAPI's default, a list of pydantic errors under ``detail``, is never
sent: it echoes the input and differs from every other refusal.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

#: `error` of a body that is not (strict) JSON.
INVALID_JSON = "InvalidJSON"
#: `error` of a body whose fields do not fit the route's request model (a type, a range, an unknown field).
INVALID_BODY = "ValidationError"
#: Longest text of one field's error kept in a `detail`.
MAX_ERROR_CHARS = 200
#: Most field errors named in one `detail`.
MAX_FIELD_ERRORS = 5


def refusal(status: int, detail: str, error: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON answer of a refused request."""
    return JSONResponse({"detail": detail, "error": error}, status_code=status, headers=headers)


def status_error(status: int) -> str:
    """The `error` of a bare HTTP refusal (an unknown route, a wrong method): its reason phrase as one word,
    "NotFound", "MethodNotAllowed"."""
    try:
        return HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "")
    except ValueError:
        return "HTTPError"


def validation_detail(errors: Sequence[Any]) -> str:
    """Pydantic's errors as one line that never echoes the input: "seed: Input should be a valid integer; human:
    Input should be a valid boolean" (where in the body, then what is wrong; `body` itself left out)."""
    parts = []
    for e in list(errors)[:MAX_FIELD_ERRORS]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "the body"
        parts.append(f"{where}: {_short(str(e.get('msg', 'invalid')))}")
    more = len(errors) - MAX_FIELD_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def validation_error(errors: Sequence[Any]) -> str:
    """The `error` of a refused body: `INVALID_JSON` when it did not parse, else `INVALID_BODY`."""
    return INVALID_JSON if any(e.get("type") == "json_invalid" for e in errors) else INVALID_BODY


def _short(text: str) -> str:
    text = " ".join(text.encode("utf-8", errors="replace").decode("utf-8").split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."
