"""The trainer rides out an env or rollout that goes away mid-training: env, rollout and trainer as
separate processes with their tokens (as `python app.py` starts them); the env, then the rollout, is
stopped and started again on its port. Training stays `running`, `/status` shows the error while it
retries, steps resume once the server is back, and the owner's stop ends the wait between retries."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import httpx

from tests._env_server import free_port, running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, wait_until

TOKENS = {"ENV_TOKEN": "env-secret", "ROLLOUT_TOKEN": "rollout-secret"}
OWNER = "owner-secret"
#: What the trainer may see of a rollout that stops, each a documented answer (`rollout_space.engines.base`): the
#: request it was generating for answered 503 "closed while generating"; one that arrived once the close began,
#: 503 "is closed" (which comes first is a race between the request and the stop); then no answer at all.
STOPPING_ROLLOUT = ("did not answer /rollout", "the engine was closed while generating",
                    "the engine is closed; start a new one")


def status(trainer: str) -> dict[str, Any]:
    return httpx.get(f"{trainer}/status", timeout=10).json()


def ride_out(trainer: str, outage: contextlib.ExitStack, restart: Callable[[], None], *says: str) -> None:
    """Stop a server (`outage.close()`), check the trainer retries while running with an error that says one of
    `says`, `restart` it, and check steps resume."""
    before = status(trainer)["step"]
    outage.close()
    failing = wait_until(lambda: (s := status(trainer))["rollout_failing"] and s, 60, "the trainer to see the outage")
    assert failing["state"] == "running" and failing["error"] is None
    assert any(s in failing["rollout_error"] for s in says), failing["rollout_error"]
    restart()
    # A step after the restart, and the failures in a row cleared: a step may end on games fetched while a request
    # begun in the outage still fails (the count clears at the next request that succeeds).
    back = wait_until(lambda: (s := status(trainer))["step"] > max(before, failing["step"])
                      and s["rollout_failing"] == 0 and s, 120, "a step after the restart, its failures cleared")
    assert back["state"] == "running" and back["error"] is None
    assert back["rollout_error"]  # the last error stays on show, marked recovered


def test_training_stays_running_through_an_env_and_a_rollout_outage(tmp_path) -> None:
    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    env_port, rollout_port = free_port(), free_port()
    env_url, rollout_url = f"http://127.0.0.1:{env_port}", f"http://127.0.0.1:{rollout_port}"
    env_up, rollout_up = contextlib.ExitStack(), contextlib.ExitStack()

    def start_env() -> None:
        env_up.enter_context(running_server("env", port=env_port, env={"ENV_TOKEN": TOKENS["ENV_TOKEN"]}))

    def start_rollout() -> None:
        rollout_up.enter_context(running_server(
            "rollout", "--bucket", bucket, "--model", model, "--env-url", env_url, "--engine", "transformers",
            "--poll-interval", "0.2", "--showcase-every", "0", port=rollout_port, env=TOKENS))

    with env_up, rollout_up:
        start_env()
        start_rollout()
        with running_server("trainer", "--bucket", bucket, "--model", model, "--rollout-url", rollout_url,
                            "--env-url", env_url, "--max-steps", "1000", *FAST_TRAINING,
                            env={"ROLLOUT_TOKEN": TOKENS["ROLLOUT_TOKEN"], "OWNER_TOKEN": OWNER}) as trainer:
            wait_until(lambda: status(trainer)["step"] >= 1, 240, "the first step")
            ride_out(trainer, env_up, start_env, "(HTTP 502)")  # the rollout's games fail on the env
            ride_out(trainer, rollout_up, start_rollout, *STOPPING_ROLLOUT)
            rollout_up.close()  # the owner's stop ends the wait between retries
            wait_until(lambda: status(trainer)["rollout_failing"], 60, "the trainer to see the rollout gone")
            stop = httpx.post(f"{trainer}/control", json={"action": "stop"}, headers={"Authorization": f"Bearer {OWNER}"})
            assert stop.status_code == 200
            final = wait_until(lambda: (s := status(trainer))["state"] == "stopped" and s, 10, "the stop")
            assert final["error"] is None
        players = {g["player"] for g in httpx.get(f"{env_url}/games", params={"limit": 50}).json()}
        assert any(p.startswith("policy v") for p in players), players  # the rollout sent the env token
