"""Serving a Space's app (its API with the Gradio UI mounted) so that SIGINT and SIGTERM end it in seconds.

uvicorn, asked to stop, waits for every request in flight, up to its graceful-shutdown timeout, and then
cancels what is left, logging "Cancel N running task(s), timeout graceful shutdown exceeded" and a
`CancelledError` traceback for each. Every open page of a Gradio UI holds such a request: its session
heartbeat, a stream that ends only when the page closes or when Gradio's stop event is set, which
`gr.Blocks.launch` does and a mounted UI never gets. `UIServer` sets it as the signal arrives, and calls
the app's own `on_exit` first (the rollout interrupts its engine, the trainer stops training), so what
is in flight ends by itself and the server closes at once. It also starts the process's exit deadline
(`dashboard.deadline`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.routing import Mount

import settings

from . import deadline


def end_ui_streams(app: FastAPI) -> int:
    """Set the stop event of every Gradio UI mounted on `app`: their heartbeat streams end at the event loop's
    next turn. Returns how many UIs were found. Call from the event loop's thread (a signal handler is)."""
    from gradio.routes import App as GradioApp  # only a served app has loaded Gradio (a heavy import)

    found = 0
    for route in app.routes:
        if isinstance(route, Mount) and isinstance(route.app, GradioApp):
            route.app.stop_event.set()
            found += 1
    return found


class UIServer(uvicorn.Server):
    """uvicorn's server, which at SIGINT/SIGTERM calls `on_exit` and ends the UIs' streams before it shuts down.

    Args:
        config: uvicorn's config; its `app` is the FastAPI app (UI mounted).
        on_exit: Called first, from the signal handler: must return at once (set an event, interrupt an engine).
    """

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        deadline.arm(sig)  # the process ends by `settings.STOP_DEADLINE_S` from now, whatever holds its cleanup
        if self._on_exit is not None:
            self._on_exit()
        if isinstance(self.config.app, FastAPI):
            end_ui_streams(self.config.app)
        super().handle_exit(sig, frame)


def serve(app: FastAPI, host: str, port: int, on_exit: Callable[[], None] | None = None, **options: Any) -> None:
    """Serve `app` until SIGINT/SIGTERM, then stop within `settings.SHUTDOWN_GRACE_S`. Blocks.

    Args:
        on_exit: See `UIServer`.
        options: More `uvicorn.Config` settings (`ws_max_size`...).
    """
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=settings.SHUTDOWN_GRACE_S, **options
    )
    UIServer(config, on_exit).run()
