"""The trainer Space process: the HTTP API with the Gradio UI mounted at ``/``, served by uvicorn."""

from __future__ import annotations

import logging
import threading

from fastapi import FastAPI

import settings
from dashboard import serving
from dashboard.mount import mount_ui

from .api import build_api
from .session import TrainingSession
from .ui import CSS, build_ui

logger = logging.getLogger(__name__)


def build_app(session: TrainingSession) -> FastAPI:
    """API routes first, then the UI at ``/`` (so ``/status`` etc. stay the API's)."""
    return mount_ui(build_api(session), build_ui(session), CSS)


def serve(session: TrainingSession, host: str, port: int) -> None:
    """Serve until interrupted, then stop training and flush the last version to the bucket. Blocks.

    Training is told to stop as the signal arrives (`dashboard.serving`'s `on_exit`), while the server shuts
    down; then the step in flight gets `settings.TRAINER_STEP_WAIT_S` to end, is ended part way if it did not,
    and the last finished version gets `settings.TRAINER_FLUSH_S` to be committed, all within
    `settings.TRAINER_CLOSE_S` of the signal (and the process's deadline, `dashboard.deadline`, after that).

    A thread of the session still running past those waits is named in the log; the process then ends without
    Python's finalization (app.py), which would abort it if that thread were inside a torch operation.
    """
    try:
        serving.serve(build_app(session), host, port, on_exit=session.stop_soon)
    finally:
        if not session.close(
            step_wait=settings.TRAINER_STEP_WAIT_S,
            abandon_wait=settings.TRAINER_ABANDON_S,
            flush_timeout=settings.TRAINER_FLUSH_S,
            total=settings.TRAINER_CLOSE_S,
        ):
            left = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive())
            logger.warning("exiting with threads of the session still running (%s)", ", ".join(left))
