"""The rollout Space process: engine, follower and env client behind one FastAPI app, served by uvicorn."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

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


def serve(service: RolloutService, host: str, port: int, token: str | None = None,
          trust_forwarded: bool = False) -> None:
    """Start following, serve until interrupted, then stop following and close the engine. Blocks."""
    service.start()
    try:
        uvicorn.run(build_app(service, token, trust_forwarded), host=host, port=port, log_level="warning")
    finally:
        service.close()
