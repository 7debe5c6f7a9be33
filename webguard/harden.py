"""One call that hardens a FastAPI app: body limit, strict JSON on its routes, short 422s."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from .body import BodyLimit
from .strict_json import StrictRoute, error_summary

#: Largest integer a signed 64-bit field holds: the bound of every id, seed and version on the wire
#: (wider ints break JSON readers such as the browser's and numpy's).
MAX_INT63 = 2**63 - 1


def guard_app(app: FastAPI, max_body_bytes: int) -> FastAPI:
    """Limit request bodies to ``max_body_bytes`` (413), parse JSON bodies strictly (422) and answer
    validation errors without echoing the input. Call before adding routes (they take the strict
    route class). Returns ``app``."""
    app.router.route_class = StrictRoute
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": error_summary(exc.errors())}, status_code=422)

    return app
