"""The trainer Space's HTTP API: ``GET /health``, ``GET /status``, ``GET /history``, ``POST /control``.

Reading is open to everyone; ``POST /control`` (start, pause, stop) needs the owner's token, as
``Authorization: Bearer <token>`` or the body's ``token`` field, and answers 403 without it.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from webguard import RequestBody, bearer_token, guard_app, refusal
from wire.trainer import ControlResponse, TrainerHistory, TrainerStatus

from .session import AccessDenied, TrainingSession

#: Largest request body: control requests are a few bytes (the UI's Gradio calls are small too).
MAX_BODY_BYTES = 256 * 1024


class ControlRequest(RequestBody):
    """Body of ``POST /control``."""

    action: Literal["start", "pause", "stop"]
    token: str | None = Field(None, max_length=256, description="The owner token (or send it as a bearer token)")


def build_api(session: TrainingSession) -> FastAPI:
    """A FastAPI app with the routes above; the UI is mounted on top of it by `server.build_app`."""
    app = guard_app(FastAPI(title="Delta trainer", description=__doc__), MAX_BODY_BYTES)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    def status() -> TrainerStatus:
        return session.status()

    @app.get("/history")
    def history() -> TrainerHistory:
        history = session.history()  # the exams live in the bucket's exam files, not in the trainer's history
        exams = session.exams
        return history.model_copy(
            update={
                "exams": exams.records() if exams is not None else [],
                "exams_refused": exams.refused() if exams is not None else {},
            }
        )

    @app.post(
        "/control",
        response_model=ControlResponse,
        responses={403: {"description": "Not the owner's token"}, 409: {"description": "Not possible now"}},
    )
    def control(request: ControlRequest, http: Request) -> ControlResponse | JSONResponse:
        try:
            state = session.control(request.action, request.token or bearer_token(http.headers))
        except AccessDenied as e:
            return refusal(403, str(e), type(e).__name__)
        except ValueError as e:  # an action this trainer cannot take now (a new run under torchrun)
            return refusal(409, str(e), type(e).__name__)
        return ControlResponse(state=state)

    return app
