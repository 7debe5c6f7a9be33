"""The trainer Space process: the HTTP API with the Gradio UI mounted at ``/``, served by uvicorn."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

import settings

from dashboard.mount import mount_ui
from dashboard.render import CSS

from .api import build_api
from .session import TrainingSession
from .ui import build_ui


def build_app(session: TrainingSession) -> FastAPI:
    """API routes first, then the UI at ``/`` (so ``/status`` etc. stay the API's)."""
    return mount_ui(build_api(session), build_ui(session), CSS)


def serve(session: TrainingSession, host: str, port: int) -> None:
    """Serve until interrupted, then stop training and flush the last version to the bucket. Blocks."""
    try:
        uvicorn.run(build_app(session), host=host, port=port, log_level="warning",
                    timeout_graceful_shutdown=settings.SHUTDOWN_GRACE_S)
    finally:
        session.close(step_wait=settings.TRAINER_STEP_WAIT_S, flush_timeout=settings.TRAINER_FLUSH_S)
