"""The rollout Space process: engine, follower and env client behind one FastAPI app, served by uvicorn."""

from __future__ import annotations

from fastapi import FastAPI

import settings
from dashboard import serving

from .api import build_api
from .service import RolloutService


def build_app(service: RolloutService, token: str | None = None, trust_forwarded: bool = False) -> FastAPI:
    """The HTTP API, and the UI mounted at ``/`` on top of it (so ``/status`` etc. stay the API's).

    Args:
        token: The rollout token ``/generate`` and ``/rollout`` require (None: open).
        trust_forwarded: Key visitors' caps by the proxy's ``X-Forwarded-For`` (on a Space).
    """
    from .ui import mount_ui  # Gradio is a heavy import: only a served app needs it

    return mount_ui(build_api(service, token), service, trust_forwarded=trust_forwarded)


def serve(
    service: RolloutService, host: str, port: int, token: str | None = None, trust_forwarded: bool = False
) -> None:
    """Start following, serve until interrupted, then stop following and close the engine. Blocks.

    At SIGINT/SIGTERM the engine is interrupted first (`dashboard.serving`'s `on_exit`): the generation in flight
    ends at its next token and its request is answered (503) before the server closes, instead of holding the
    exit for a whole batch or being cancelled with a traceback.
    """
    service.start()
    try:
        serving.serve(build_app(service, token, trust_forwarded), host, port, on_exit=service.begin_close)
    finally:
        service.close(settings.ROLLOUT_CLOSE_S, engine_timeout=settings.ENGINE_CLOSE_S)
