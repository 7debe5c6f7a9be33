"""The rollout as an anonymous visitor meets it, on real servers on loopback (tiny model, env and
rollout with their tokens, as `python app.py` starts them): the trainer's routes need the token (a
trainer with a wrong one stops at once, saying so), input is bounded, and /health and /status answer
while generate calls queue on the engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests._env_server import running_server
from tests._trainer_stack import tiny_model, wait_until
from trainer_space import TrainerConfig, TrainerState, build_session
from trainer_space.rollout_client import RolloutClient
from wire.errors import RolloutRefusedError

TOKENS = {"ENV_TOKEN": "env-secret", "ROLLOUT_TOKEN": "rollout-secret"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("public")
    with running_server("env", env={"ENV_TOKEN": TOKENS["ENV_TOKEN"]}) as env, running_server(
            "rollout", "--bucket", str(root / "bucket"), "--model", tiny_model(str(root / "model")), "--env-url", env,
            "--engine", "transformers", "--showcase-every", "0", "--max-tokens", "64", env=TOKENS) as url:
        yield {"url": url, "env": env, "model": str(root / "model")}


@pytest.mark.parametrize("path, body", [("/generate", {"prompts": ["hi"], "max_tokens": 2}),
                                        ("/rollout", {"games": [{"seed": 1}], "max_tokens": 2, "max_turns": 1})])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "rollout-secret"}])
def test_the_trainers_routes_answer_401_without_the_token(stack: dict[str, Any], path: str, body: dict,
                                                          headers: dict) -> None:
    response = httpx.post(stack["url"] + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert "ROLLOUT_TOKEN" in response.json()["detail"]


def test_with_the_token_games_are_the_policys_in_the_env(stack: dict[str, Any]) -> None:
    with RolloutClient(stack["url"], timeout=120, token=TOKENS["ROLLOUT_TOKEN"]) as client:
        [game] = client.rollout([{"seed": 8}], max_tokens=2, max_turns=1)
        assert client.generate(["hi"], max_tokens=2).completions[0].token_ids
    recorded = {g["episode_id"]: g for g in httpx.get(stack["env"] + "/games", params={"limit": 200}).json()}
    assert recorded[game.episode_id]["player"] == f"policy v{game.version}"  # sent with the env token
    with RolloutClient(stack["url"], timeout=30, token="wrong") as client, pytest.raises(RolloutRefusedError,
                                                                                        match="401"):
        client.rollout([{"seed": 8}], max_tokens=2)


def test_a_trainer_with_a_wrong_token_stops_at_once_and_says_which(stack: dict[str, Any], tmp_path) -> None:
    """A wrong token cannot start working later: the run ends on the first refusal (no retry loop), and
    status says what to set."""
    config = TrainerConfig(str(tmp_path / "bucket"), stack["url"], stack["model"], rollout_token="wrong",
                           games_per_step=2, num_generations=2, max_tokens=2, max_turns=1, retry_wait=0.1)
    session = build_session(config)
    session.start()
    try:
        status = wait_until(lambda: (s := session.status()).state is TrainerState.STOPPED and s, 120,
                            "the run to stop on the refusal")
    finally:
        session.close()
    assert status.error.startswith("RolloutRefusedError") and "HTTP 401" in status.error
    assert "ROLLOUT_TOKEN" in status.error and status.rollout_failing == 1 and status.step == 0


@pytest.mark.parametrize("body", [
    {"prompts": ["a" * 70_000]},  # checked in characters, before tokenizing
    {"prompts": ["hi"] * 5000},
    {"prompts": [[1] * 70_000]},
    {"prompts": [[2**40]]},
    {"prompts": ["hi"], "max_tokens": 10**9},
    {"prompts": ["hi"], "seed": 2**63},
    {"prompts": ["hi"], "stop": list(range(100))},
], ids=["chars", "count", "ids", "id-size", "max-tokens", "seed", "stops"])
def test_unbounded_input_is_refused_with_a_short_422(stack: dict[str, Any], body: dict) -> None:
    response = httpx.post(stack["url"] + "/generate", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {TOKENS['ROLLOUT_TOKEN']}"})
    assert response.status_code == 422 and len(response.content) < 3000


def test_nan_and_huge_bodies_never_reach_a_handler(stack: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {TOKENS['ROLLOUT_TOKEN']}", "content-type": "application/json"}
    nan = httpx.post(stack["url"] + "/generate", content=b'{"prompts": ["hi"], "temperature": NaN}', headers=auth)
    assert nan.status_code == 422
    huge = httpx.post(stack["url"] + "/generate", content=b'{"prompts": ["' + b"a" * 9_000_000 + b'"]}', headers=auth)
    assert huge.status_code == 413 and len(huge.content) < 500


def test_health_and_status_answer_while_generate_calls_queue(stack: dict[str, Any]) -> None:
    url, auth = stack["url"], {"Authorization": f"Bearer {TOKENS['ROLLOUT_TOKEN']}"}
    body = {"prompts": ["hello there"] * 4, "max_tokens": 64, "temperature": 1.0}
    done: list[int] = []
    callers = [threading.Thread(target=lambda: done.append(
        httpx.post(url + "/generate", json=body, headers=auth, timeout=300).status_code)) for _ in range(48)]
    for t in callers:
        t.start()
    try:
        for _ in range(3):  # each answered while (most of) the 48 calls still wait on the engine
            assert httpx.get(url + "/health", timeout=60).status_code == 200
            assert httpx.get(url + "/status", timeout=60).json()["engine"] == "transformers"
        assert len(done) < len(callers)
    finally:
        for t in callers:
            t.join(timeout=300)
    assert done == [200] * len(callers)
