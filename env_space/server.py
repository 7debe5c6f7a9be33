"""The Space process: the HTTP API and the Gradio UI on one FastAPI app, served by uvicorn."""

from __future__ import annotations

from fastapi import FastAPI

from dashboard import serving
from dashboard.mount import mount_ui
from dashboard.render import CSS

from .api import MAX_BODY_BYTES, Access, build_api
from .history import GameHistory
from .rewards import DEFAULT_REWARDS, RewardConfig
from .sessions import DEFAULT_LIMITS, SessionLimits, SessionStore
from .ui import build_ui
from .words import load_word_lists


def build_app(
    limits: SessionLimits = DEFAULT_LIMITS, access: Access | None = None, rewards: RewardConfig = DEFAULT_REWARDS
) -> FastAPI:
    """API routes first, then the UI mounted at ``/`` (so ``/reset``, ``/health``... stay the API's)."""
    access = access or Access()
    store = SessionStore(load_word_lists(), GameHistory(), limits, rewards)
    app = build_api(store, access)
    return mount_ui(app, build_ui(store, access.trust_forwarded), CSS)


def serve(
    host: str,
    port: int,
    limits: SessionLimits = DEFAULT_LIMITS,
    access: Access | None = None,
    rewards: RewardConfig = DEFAULT_REWARDS,
) -> None:
    """Serve until interrupted (`dashboard.serving`: its pages' streams end at the signal). Blocks."""
    serving.serve(build_app(limits, access, rewards), host, port, ws_max_size=MAX_BODY_BYTES)
