"""The rollout Space process: engine, follower and env client behind one FastAPI app, served by uvicorn."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from .api import build_api
from .service import RolloutService


def build_app(service: RolloutService) -> FastAPI:
    """The HTTP API, and the UI mounted at ``/`` on top of it (so ``/status`` etc. stay the API's)."""
    from .ui import mount_ui  # Gradio is a heavy import: only a served app needs it

    return mount_ui(build_api(service), service)


def serve(service: RolloutService, host: str, port: int) -> None:
    """Start following, serve until interrupted, then stop following and close the engine. Blocks."""
    service.start()
    try:
        uvicorn.run(build_app(service), host=host, port=port, log_level="warning")
    finally:
        service.close()
