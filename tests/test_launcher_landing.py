"""The landing page's cards against apps that answer their status, something else, or nothing (each app a
real server on loopback)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from launcher.children import Child
from launcher.landing import build_app
from rollout_space.messages import RolloutStatus
from trainer_space import TrainerConfig, TrainingSession

from ._env_server import free_port, serving

ROLLOUT = RolloutStatus(version=3, latest_version=4, lag=1, engine="transformers", device="cpu", model="m",
                        bucket="b", env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                        tokens_served=10, games_played=1)


def answering(body: Any) -> FastAPI:
    """An app whose ``/status`` and ``/health`` answer `body`."""
    app = FastAPI()
    app.get("/status")(lambda: body)
    app.get("/health")(lambda: body)
    return app


def ready(role: str, url: str) -> Child:
    return Child(role=role, host="127.0.0.1", port=int(url.rsplit(":", 1)[1]), args=[], log_path="", state="ready")


def cards(children: list[Child]) -> dict[str, dict[str, Any]]:
    with TestClient(build_app(children, "bucket")) as client:
        return {c["role"]: c for c in client.get("/api/status").json()["apps"]}


def test_cards_show_what_each_app_says_of_itself(tmp_path) -> None:
    trainer = TrainingSession(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    with serving(answering(ROLLOUT.model_dump())) as rollout, serving(answering(trainer.model_dump())) as url, \
            serving(answering({"status": "healthy"})) as env:
        shown = cards([ready("env", env), ready("rollout", rollout), ready("trainer", url)])
    assert shown["env"]["state"] == "ready" and shown["env"]["fields"] == []
    assert shown["rollout"]["fields"] == [["weights version", 3], ["versions behind", 1], ["engine", "transformers"],
                                          ["syncs", 2]]
    assert shown["trainer"]["fields"] == [["published version", 0], ["step", 0], ["mean reward", "—"],
                                          ["training", "stopped"], ["resumed from version", "—"]]


def test_an_app_answering_something_else_gets_a_card_saying_so() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with serving(answering([1, 2, 3])) as listing, serving(answering({**ROLLOUT.model_dump(), "lag": "far"})) as wrong:
        shown = cards([ready("rollout", wrong), ready("trainer", listing), ready("env", dead)])
    assert shown["rollout"]["state"] == "answering something other than its status (1 field wrong)"
    assert shown["trainer"]["state"].startswith("answering something other than its status")
    assert shown["env"]["state"] == "not answering (ConnectError)"
    assert all(card["fields"] == [] for card in shown.values())
