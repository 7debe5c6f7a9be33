"""What the three public apps share to stay up when strangers call them: a request-size limit, strict
JSON, short validation errors, bearer tokens and the client's address as the Space's proxy reports it.

Imports no Space code; each Space calls :func:`guard_app` on its FastAPI app before adding routes.
"""

from .auth import auth_headers, bearer_token, token_matches
from .body import BodyLimit, BodyTooLarge
from .clients import client_address
from .harden import MAX_INT63, guard_app
from .strict_json import StrictJSONError, error_summary, loads_strict

__all__ = [
    "MAX_INT63",
    "BodyLimit",
    "BodyTooLarge",
    "StrictJSONError",
    "auth_headers",
    "bearer_token",
    "client_address",
    "error_summary",
    "guard_app",
    "loads_strict",
    "token_matches",
]
