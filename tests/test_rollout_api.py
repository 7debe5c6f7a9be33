"""`python app.py rollout` as a user starts it: a real server on a tiny model, a real env, a local bucket."""

from __future__ import annotations

import time

import httpx
import pytest

from delta import read_manifest
import delta
from tests._engines import build_model, published, step
from tests._env_server import running_server, serving
from trainer_space.rollout_client import RolloutClient
from wire.env import MAX_REPLY_CHARS
from wire.wordle import reply_excerpt
from wire.errors import RolloutError
from wire.rollout import GenerateResponse, RolloutResponse, RolloutStatus, Trajectory


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    model = build_model(str(root / "model"), seed=4)
    bucket = str(root / "bucket")
    state, publisher = published(model, bucket)
    with running_server("env") as env_url, running_server(
            "rollout", "--bucket", bucket, "--model", model, "--env-url", env_url, "--engine", "transformers",
            "--max-batch", "4", "--max-tokens", "32", "--poll-interval", "0.1", "--showcase-every", "0",
            timeout_s=120) as url:
        with RolloutClient(url, timeout=120) as client:
            yield {"client": client, "url": url, "publisher": publisher, "state": state, "bucket": bucket,
                   "env_url": env_url}
    publisher.close()


def test_status_says_what_is_served(stack):
    status = stack["client"].status()
    assert status.version == 1 and status.latest_version == 1 and status.lag == 0
    assert status.engine == "transformers" and status.last_error is None and status.note is None
    public = httpx.get(stack["url"] + "/status", timeout=30).text  # a public route: no folder of this machine on it
    assert stack["bucket"] not in public and (status.bucket, status.model) == ("local folder …/bucket",
                                                                            "local folder …/model")


def test_every_answer_is_its_typed_message(stack):
    """/docs names each route's model, the JSON holds exactly its keys, and the client returns the models: a
    route drifting from its model fails here."""
    paths = httpx.get(stack["url"] + "/openapi.json", timeout=30).json()["paths"]
    for path, method, model in [("/status", "get", RolloutStatus), ("/generate", "post", GenerateResponse),
                                ("/rollout", "post", RolloutResponse)]:
        schema = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, path

    def keys(model: type) -> set[str]:
        return set(model.model_json_schema(mode="serialization")["properties"])

    assert set(httpx.get(stack["url"] + "/status", timeout=30).json()) == keys(RolloutStatus)
    [game] = httpx.post(stack["url"] + "/rollout", json={"games": [{"seed": 1}], "max_tokens": 2, "max_turns": 1},
                        timeout=120).json()["trajectories"]
    assert set(game) == keys(Trajectory) and "version" in game  # the computed oldest version is sent too
    assert isinstance(stack["client"].status(), RolloutStatus)
    assert isinstance(stack["client"].generate(["Hi"], max_tokens=1), GenerateResponse)
    assert all(isinstance(t, Trajectory) for t in stack["client"].rollout([{"seed": 1}], max_tokens=1, max_turns=1))


def test_an_answer_that_is_not_the_message_is_a_clear_error():
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/status")(lambda: {"version": "three"})
    with serving(app) as url, RolloutClient(url) as client, pytest.raises(
            RolloutError, match="answered /status with something that is not a RolloutStatus .*--rollout-url"):
        client.status()


def test_generate_returns_ids_logprobs_and_version(stack):
    reply = stack["client"].generate(["Hello", [5, 6, 7]], max_tokens=5, temperature=0)
    assert reply.version == 1 and len(reply.completions) == 2
    for c in reply.completions:
        assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 5
        assert c.version == 1 and all(lp <= 0 for lp in c.logprobs)
    assert reply.completions[1].prompt_ids == [5, 6, 7]


@pytest.mark.parametrize("body, flag", [({"prompts": ["a"] * 5}, "--max-batch"),
                                        ({"prompts": ["a"], "max_tokens": 33}, "--max-tokens")])
def test_requests_over_the_caps_are_refused_with_what_to_change(stack, body, flag):
    response = httpx.post(stack["url"] + "/generate", json=body, timeout=30)
    assert response.status_code == 413 and flag in response.json()["detail"]


def test_bad_requests_are_refused_clearly(stack):
    response = httpx.post(stack["url"] + "/generate", json={"prompts": [[999999]], "max_tokens": 4}, timeout=30)
    assert response.status_code == 422 and "vocabulary" in response.json()["detail"]
    with pytest.raises(RolloutError, match="HTTP 422"):
        stack["client"].rollout([], max_tokens=4)


def test_rollout_plays_whole_games_as_trajectories(stack):
    trajectories = stack["client"].rollout([{"seed": 3}, {"seed": 3}], max_tokens=6, max_turns=2, seed=1)
    assert len(trajectories) == 2
    for t in trajectories:
        assert len(t.completion_ids) == len(t.logprobs) == len(t.env_mask)
        assert t.version == 1 and t.versions == [1, 1] and len(t.replies) == 2


def test_follows_new_versions_while_serving(stack):
    publisher, state = stack["publisher"], stack["state"]
    new = step(state, sorted(state)[:4], seed=9)
    publisher.publish(new)
    publisher.flush()
    deadline = time.monotonic() + 60
    while stack["client"].status().version != 2:
        assert time.monotonic() < deadline, stack["client"].status()
        time.sleep(0.1)
    reply = stack["client"].generate(["Hi"], max_tokens=2)
    assert reply.version == 2
    manifest = read_manifest(delta.Bucket.open(stack["bucket"]))
    assert manifest.latest.state_hash == delta.state_digest(new).hexdigest == stack["client"].status().state_hash


def test_games_played_counts_every_game_not_only_those_kept_for_the_ui(stack):
    before = stack["client"].status().games_played
    stack["client"].rollout([{"seed": s} for s in range(120)], max_tokens=1, max_turns=1, seed=1)
    assert stack["client"].status().games_played == before + 120


def test_the_env_and_the_rollout_keep_one_record_of_each_game(stack):
    """A game the rollout cuts at its turn limit is "unfinished" on both sides, with the env's counts."""
    trajectories = stack["client"].rollout([{"seed": 5}, {"seed": 6}], max_tokens=4, max_turns=2, seed=2)
    recorded = {g["episode_id"]: g for g in httpx.get(stack["env_url"] + "/games", params={"limit": 50},
                                                      timeout=30).json()}
    for t in trajectories:
        env = recorded[t.episode_id]
        assert (env["won"], env["finished"], env["invalid_moves"]) == (t.won, t.finished, t.invalid_moves)
        assert list(env["replies"]) == [reply_excerpt(r, MAX_REPLY_CHARS) for r in t.replies]
        assert list(env["guesses"]) == t.guesses


def test_a_bug_is_a_500_not_a_bad_request():
    """A ValueError from a bug (not one of the request errors the API maps) must not blame the caller."""
    from fastapi.testclient import TestClient

    from rollout_space.api import build_api

    class Broken:
        def generate(self, prompts, params, at=None):
            raise ValueError("an internal bug")

    with TestClient(build_api(Broken()), raise_server_exceptions=False) as client:
        response = client.post("/generate", json={"prompts": ["hello"], "max_tokens": 4})
    assert response.status_code == 500 and "an internal bug" not in response.text
