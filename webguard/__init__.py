"""What the three public apps share to stay up when strangers call them: a request-size limit, strict
JSON, one request model and one shape of refusal, bearer tokens and the client's address as the Space's
proxy reports it; and the other side, one JSON request to another app with its reply bounded (`webguard.calls`).

Imports no Space code; each Space calls :func:`guard_app` on its FastAPI app before adding routes.
"""

from .answers import refusal, validation_detail
from .auth import auth_headers, bearer_token, token_matches
from .body import BodyLimit, BodyTooLarge
from .clients import client_address
from .harden import MAX_INT63, guard_app
from .request_body import RequestBody
from .strict_json import StrictJSONError, loads_strict

__all__ = [
    "MAX_INT63",
    "BodyLimit",
    "BodyTooLarge",
    "RequestBody",
    "StrictJSONError",
    "auth_headers",
    "bearer_token",
    "client_address",
    "guard_app",
    "loads_strict",
    "refusal",
    "token_matches",
    "validation_detail",
]
