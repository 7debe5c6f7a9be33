"""The trainer Space's HTTP API: ``GET /health``, ``GET /status``, ``GET /history``, ``POST /control``.

Reading is open to everyone; ``POST /control`` (start, pause, stop) needs the owner's token, as
``Authorization: Bearer <token>`` or the body's ``token`` field, and answers 403 without it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from webguard import bearer_token, guard_app

from .session import AccessDenied, TrainingSession

#: Largest request body: control requests are a few bytes (the UI's Gradio calls are small too).
MAX_BODY_BYTES = 256 * 1024


class ControlRequest(BaseModel):
    """Body of ``POST /control``."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["start", "pause", "stop"]
    token: str | None = Field(None, max_length=256, description="The owner token (or send it as a bearer token)")


def build_api(session: TrainingSession) -> FastAPI:
    """A FastAPI app with the routes above; the UI is mounted on top of it by `server.build_app`."""
    app = guard_app(FastAPI(title="Delta trainer", description=__doc__), MAX_BODY_BYTES)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    def status() -> dict[str, Any]:
        return session.status()

    @app.get("/history")
    def history() -> dict[str, Any]:
        payloads = session.payloads.records if session.payloads is not None else []
        return {"steps": [asdict(r) for r in session.records], "payloads": [asdict(p) for p in payloads]}

    @app.post("/control")
    def control(request: ControlRequest, http: Request) -> JSONResponse:
        try:
            state = session.control(request.action, request.token or bearer_token(http.headers))
        except AccessDenied as e:
            return JSONResponse({"detail": str(e)}, status_code=403)
        return JSONResponse({"state": state})

    return app
