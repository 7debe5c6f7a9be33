"""One call that hardens a FastAPI app: body limit, strict JSON on its routes, one shape of refusal."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import HTTPException as FastAPIHTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .answers import refusal, status_error, validation_detail, validation_error
from .body import BodyLimit
from .strict_json import StrictRoute

#: Largest integer a signed 64-bit field holds: the bound of every id, seed and version on the wire
#: (wider ints break JSON readers such as the browser's and numpy's).
MAX_INT63 = 2**63 - 1


def guard_app(app: FastAPI, max_body_bytes: int) -> FastAPI:
    """Limit request bodies to ``max_body_bytes`` (413), parse JSON bodies strictly (422), and answer every refusal
    FastAPI makes itself (a malformed or mistyped body, a bare HTTP error) as ``{"detail": "<one line>", "error":
    "<class>"}`` (`webguard.answers`), without echoing the input. Call before adding routes (they take the strict
    route class). Returns ``app``."""
    app.router.route_class = StrictRoute
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        return refusal(422, validation_detail(errors), validation_error(errors))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        generic = type(exc) in (HTTPException, FastAPIHTTPException)  # a subclass names its own kind (BodyTooLarge)
        return refusal(
            exc.status_code,
            str(exc.detail),
            status_error(exc.status_code) if generic else type(exc).__name__,
            dict(exc.headers) if exc.headers else None,
        )

    return app
