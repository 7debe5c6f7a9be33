"""The rollout Space process: engine, follower and env client behind one FastAPI app, served by uvicorn."""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

import settings

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


class _Server(uvicorn.Server):
    """uvicorn's server, which on SIGINT/SIGTERM first interrupts the engine: the generation in flight
    ends at its next token and its request is answered (503) before the server closes, instead of
    holding the exit for a whole batch or being cancelled with a traceback."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def serve(service: RolloutService, host: str, port: int, token: str | None = None,
          trust_forwarded: bool = False) -> None:
    """Start following, serve until interrupted, then stop following and close the engine. Blocks."""
    service.start()
    try:
        config = uvicorn.Config(build_app(service, token, trust_forwarded), host=host, port=port, log_level="warning",
                                timeout_graceful_shutdown=settings.SHUTDOWN_GRACE_S)
        _Server(config, service.engine.interrupt).run()
    finally:
        service.close()
