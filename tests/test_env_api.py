"""The HTTP API against real servers on loopback: OpenEnv-shaped reset/step/state, errors,
bounded sessions, the WebSocket session protocol, and a 256-session load test, as the rollout plays
(with the env token); anonymous visitors' limits are in test_env_public.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from env_space.words import load_word_lists
from wire.env import CloseResponse, GameRecord, PlayerStats, StepResponse, WordleObservation
from wire.wordle import encode, score

from ._env_server import running_server

MAX_SESSIONS = 300  # room for the load test's 256 games, small enough to fill in a test
TOKEN = "test-env-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server("env", "--max-sessions", str(MAX_SESSIONS), env={"ENV_TOKEN": TOKEN}) as base:
        yield base


def reset(base: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base}/reset", json=body, headers=AUTH)


def step(base: str, episode_id: str, guess: str) -> httpx.Response:
    return httpx.post(f"{base}/step", json={"episode_id": episode_id, "action": {"guess": guess}})


def ws_connect(base: str) -> Any:
    return connect(base.replace("http", "ws") + "/ws", additional_headers=AUTH)


def test_a_game_over_http(url: str) -> None:
    started = reset(url, secret="crane", weight_version=7).json()
    assert started["reward"] is None and started["done"] is False
    obs = started["observation"]
    assert obs["player"] == "policy v7" and obs["message"].startswith("Let's play Wordle.")
    eid = obs["episode_id"]

    moved = step(url, eid, "Thinking... <guess>slate</guess>").json()
    assert set(moved) == {"observation", "reward", "done"}
    assert moved["observation"]["rows"] == [{"word": "slate", "marks": "XXGXG"}]
    assert moved["reward"] == pytest.approx(0.2) and not moved["done"]

    state = httpx.get(f"{url}/state", params={"episode_id": eid}).json()
    assert state["episode_id"] == eid and state["step_count"] == 1 and state["secret"] is None

    won = step(url, eid, "<guess>crane</guess>").json()
    assert won["done"] and won["observation"]["won"] and won["observation"]["secret"] == "crane"
    games = httpx.get(f"{url}/games", params={"policy_only": True}).json()
    assert any(g["episode_id"] == eid and g["player"] == "policy v7" and g["won"] for g in games)
    stats = {s["player"]: s for s in httpx.get(f"{url}/stats").json()}
    assert stats["policy v7"]["wins"] >= 1 and 0 < stats["policy v7"]["win_rate"] <= 1


def test_every_answer_is_its_typed_message(url: str) -> None:
    """The OpenAPI schema names each route's model, and what the server sends holds exactly that model's
    keys: a route drifting from its model fails here."""
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    models = {("/reset", "post"): StepResponse, ("/step", "post"): StepResponse, ("/state", "get"): WordleObservation,
              ("/close", "post"): CloseResponse, ("/games", "get"): GameRecord, ("/stats", "get"): PlayerStats}
    for (path, method), model in models.items():
        schema = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema.get("items", schema) == {"$ref": f"#/components/schemas/{model.__name__}"}, path

    def keys(model: type) -> set[str]:
        return set(model.model_json_schema(mode="serialization")["properties"])

    started = reset(url, secret="crane", weight_version=8).json()
    eid = started["observation"]["episode_id"]
    moved = step(url, eid, "<guess>crane</guess>").json()
    for answer in (started, moved):
        assert set(answer) == keys(StepResponse) == {"observation", "reward", "done"}
        assert set(answer["observation"]) == keys(WordleObservation) - {"reward", "done"}  # OpenEnv's shape
    assert StepResponse.model_validate(moved).merged().won
    second = reset(url, weight_version=8).json()["observation"]["episode_id"]
    assert set(httpx.get(f"{url}/state", params={"episode_id": second}).json()) == keys(WordleObservation)
    assert CloseResponse.model_validate(httpx.post(f"{url}/close", json={"episode_id": second}).json()).closed
    [game] = [g for g in httpx.get(f"{url}/games", params={"limit": 200}).json() if g["episode_id"] == eid]
    assert set(game) == keys(GameRecord) and GameRecord.model_validate(game).won
    stats = httpx.get(f"{url}/stats").json()
    assert all(set(s) == keys(PlayerStats) for s in stats) and "win_rate" in keys(PlayerStats)


def test_a_person_playing_through_another_app_is_recorded_as_human(url: str) -> None:
    obs = httpx.post(f"{url}/reset", json={"human": True, "seed": 3}).json()["observation"]
    assert obs["player"] == "human"


def test_reset_without_a_body_and_invalid_moves(url: str) -> None:
    response = httpx.post(f"{url}/reset", headers=AUTH)
    assert response.status_code == 200
    obs = response.json()["observation"]
    assert obs["player"] == "policy"
    bad = step(url, obs["episode_id"], "no idea, sorry").json()
    assert bad["reward"] == -0.2 and not bad["done"]
    assert bad["observation"]["error"].startswith("no guess found")


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "detail"),
    [
        (
            "post",
            "/step",
            {"episode_id": "nope", "action": {"guess": "crane"}},
            404,
            "no live game session 'nope'",
        ),
        ("get", "/state?episode_id=nope", None, 404, "no live game session 'nope'"),
        ("post", "/close", {"episode_id": "nope"}, 404, "no live game session 'nope'"),
        ("post", "/reset", {"secret": "xyzzy"}, 422, "invalid secret: 'xyzzy' is not in the word list"),
    ],
)
def test_errors_say_what_went_wrong(
    url: str, method: str, path: str, body: Any, status: int, detail: str
) -> None:
    response = httpx.request(method, f"{url}{path}", json=body)
    assert response.status_code == status
    assert response.json()["detail"].startswith(detail)


def test_malformed_requests_are_rejected(url: str) -> None:
    assert httpx.post(f"{url}/step", json={"episode_id": "x"}).status_code == 422
    assert reset(url, weight_version=-1).status_code == 422
    assert reset(url, weight_version=2**63).status_code == 422
    assert step(url, "x", "a" * 40_000).status_code == 422


def test_own_episode_ids_and_close(url: str) -> None:
    assert reset(url, episode_id="rollout-17").json()["observation"]["episode_id"] == "rollout-17"
    clash = reset(url, episode_id="rollout-17")
    assert clash.status_code == 409 and "already in use" in clash.json()["detail"]
    assert httpx.post(f"{url}/close", json={"episode_id": "rollout-17"}).json() == {
        "episode_id": "rollout-17",
        "closed": True,
    }
    assert step(url, "rollout-17", "crane").status_code == 404


def test_schema_and_metadata(url: str) -> None:
    schema = httpx.get(f"{url}/schema").json()
    assert schema["action"]["properties"]["guess"]["type"] == "string"
    assert "rows" in schema["observation"]["properties"]
    assert httpx.get(f"{url}/metadata").json()["name"] == "wordle"


def test_full_server_answers_503_until_a_slot_frees(url: str) -> None:
    with httpx.Client(base_url=url, headers=AUTH) as client:
        mine = []
        while (response := client.post("/reset")).status_code == 200:
            mine.append(response.json()["observation"]["episode_id"])
            assert len(mine) <= MAX_SESSIONS
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert response.json() == {
            "detail": f"server full: {MAX_SESSIONS} of {MAX_SESSIONS} game sessions are in use; "
            "finish or close a game, or retry when an idle session expires",
            "error": "ServerFullError",
        }
        with ws_connect(url) as ws:
            ws.send(json.dumps({"type": "reset"}))
            refused = json.loads(ws.recv(timeout=10))["data"]
            assert refused["code"] == "CAPACITY_REACHED" and refused["message"].startswith("server full")
        for eid in mine:
            assert client.post("/close", json={"episode_id": eid}).status_code == 200
        assert client.post("/reset").status_code == 200


def test_websocket_session_like_openenv(url: str) -> None:
    with ws_connect(url) as ws:

        def send(message: dict[str, Any]) -> dict[str, Any]:
            ws.send(json.dumps(message))
            return json.loads(ws.recv(timeout=10))

        assert send({"type": "step", "data": {"guess": "crane"}})["data"]["code"] == "SESSION_ERROR"
        started = send({"type": "reset", "data": {"secret": "crane", "weight_version": 2}})
        assert started["type"] == "observation" and started["data"]["done"] is False
        moved = send({"type": "step", "data": {"guess": "<guess>trace</guess>"}})
        assert moved["data"]["observation"]["rows"] == [{"word": "trace", "marks": "XGGYG"}]
        state = send({"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 1
        assert send({"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        assert send({"type": "step", "data": {"word": "x"}})["data"]["code"] == "VALIDATION_ERROR"
        ws.send("not json")
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "INVALID_JSON"
        assert send({"type": "step", "data": {"guess": "crane"}})["data"]["done"] is True
        assert send({"type": "close"})["type"] == "closed"


def test_websocket_disconnect_drops_the_game(url: str) -> None:
    with connect(url.replace("http", "ws") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset"}))
        eid = json.loads(ws.recv(timeout=10))["data"]["observation"]["episode_id"]
        assert httpx.get(f"{url}/state", params={"episode_id": eid}).status_code == 200
    deadline = time.monotonic() + 5
    while httpx.get(f"{url}/state", params={"episode_id": eid}).status_code != 404:
        assert time.monotonic() < deadline, "the game outlived its WebSocket"
        time.sleep(0.05)


class _Connection:
    """One keep-alive HTTP/1.1 connection speaking JSON: a load generator light enough that the
    server, not the client, is what gets measured on two cores (httpx's async pool is not)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, base: str) -> _Connection:
        host, port = base.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: loopback\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        self._writer.write(head.encode() + payload)
        await self._writer.drain()
        status_line, *headers = (await self._reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        length = next(int(h.split(":")[1]) for h in headers if h.lower().startswith("content-length:"))
        return int(status_line.split()[1]), json.loads(await self._reader.readexactly(length))

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def test_256_concurrent_games_each_get_their_own_answers(url: str) -> None:
    """256 sessions live at once, each on its own connection with its own secret, all playing
    whole games concurrently: every answer is right and belongs to its own session."""
    openers = ["fjord", "slate", "pinky", "gumbo", "wreck"]
    secrets = [w for w in load_word_lists().answers if w not in openers][::7][:256]
    assert len(set(secrets)) == 256
    all_started = asyncio.Event()
    started: list[str] = []

    async def play(secret: str) -> None:
        conn = await _Connection.open(url)
        status, body = await conn.post("/reset", {"secret": secret, "weight_version": 99})
        assert status == 200
        eid = body["observation"]["episode_id"]
        started.append(eid)
        if len(started) == len(secrets):
            all_started.set()
        await all_started.wait()  # every session is live before anyone moves
        for n, guess in enumerate([*openers, secret], start=1):
            status, body = await conn.post(
                "/step", {"episode_id": eid, "action": {"guess": f"<guess>{guess}</guess>"}}
            )
            obs = body["observation"]
            assert status == 200 and obs["episode_id"] == eid and len(obs["rows"]) == n
            assert obs["rows"][-1] == {"word": guess, "marks": encode(score(guess, secret))}
        assert body["done"] and obs["won"] and obs["secret"] == secret
        await conn.close()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(play(s) for s in secrets)), timeout=60)

    asyncio.run(main())  # bounded: 60 s for them all
    assert len(set(started)) == 256
    stats = {s["player"]: s for s in httpx.get(f"{url}/stats").json()}
    assert stats["policy v99"] == {"player": "policy v99", "kind": "play", "games": 256, "wins": 256, "win_rate": 1.0}


def test_examples_false_and_exams_over_http_and_the_websocket(url: str) -> None:
    held_out = load_word_lists().exam_secrets
    started = reset(url, weight_version=2, exam=5, examples=False).json()["observation"]
    assert started["example"] is None and "for example" not in started["message"]
    moved = step(url, started["episode_id"], "<guess>guess</guess>").json()["observation"]
    assert moved["example"] is None and moved["copied"] is True  # GUESS: a word of the instructions
    fading = reset(url, seed=9, examples=0.0).json()["observation"]
    assert fading["example"] is None
    assert reset(url, seed=9, examples=1).json()["observation"]["example"] == "crane"
    for bad in ({"examples": 1.5}, {"examples": "some"}, {"exam": 64}, {"exam": -1}):
        assert reset(url, **bad).status_code == 422
    with ws_connect(url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"exam": 0, "examples": False, "weight_version": 3}}))
        observation = json.loads(ws.recv())["data"]["observation"]
        assert observation["example"] is None and "for example" not in observation["message"]
        for word in ("slate", "round", "piano"):
            ws.send(json.dumps({"type": "step", "data": {"guess": f"<guess>{word}</guess>"}}))
            assert json.loads(ws.recv())["data"]["observation"]["example"] is None
    done = False
    while not done:  # the exam game to its end: recorded as an exam game
        done = step(url, started["episode_id"], "<guess>zzzzz</guess>").json()["done"]
    [record] = [GameRecord.model_validate(g) for g in httpx.get(f"{url}/games", params={"limit": 200}).json()
                if g["episode_id"] == started["episode_id"]]
    assert record.exam and record.secret == held_out[5] and record.copied == (True,) + (False,) * 7


def test_a_game_s_kind_is_recorded_and_counted_apart(url: str) -> None:
    """The rollout says why it plays each game (training, showcase, match, exam); the env records it and counts each
    kind apart. Only a token holder names a kind, and only an exam game is of kind exam."""
    for kind in ("training", "showcase", "match"):
        started = reset(url, weight_version=41, kind=kind).json()["observation"]
        step(url, started["episode_id"], "<guess>slate</guess>")  # a move, then cut: recorded unfinished
        assert httpx.post(f"{url}/close", json={"episode_id": started["episode_id"]}).status_code == 200
    games = httpx.get(f"{url}/games", params={"limit": 200}).json()
    records = {g["kind"]: g for g in games if g["player"] == "policy v41"}
    assert set(records) == {"training", "showcase", "match"}
    showcase = httpx.get(f"{url}/games", params={"kind": "showcase", "limit": 200}).json()
    assert showcase and {g["kind"] for g in showcase} == {"showcase"}  # one kind at a time, as the page's feed shows
    stats = {s["kind"]: s["games"] for s in httpx.get(f"{url}/stats").json() if s["player"] == "policy v41"}
    assert stats == {"training": 1, "showcase": 1, "match": 1}
    assert reset(url, kind="exam").status_code == 422 and reset(url, exam=1, kind="training").status_code == 422
    assert reset(url, kind="coaching").status_code == 422
    anonymous = httpx.post(f"{url}/reset", json={"kind": "training"})
    assert anonymous.status_code == 403 and "kind training needs the env token" in anonymous.json()["detail"]


def test_the_exam_reference_is_served(url: str) -> None:
    info = httpx.get(f"{url}/exam", params={"games": 16, "turns": 3}).json()
    assert info["held_out"] == 64 and info["copying"]["valid_rate"] == 1.0 and info["copying"]["own"] == 0
    assert httpx.get(f"{url}/exam", params={"games": 65}).status_code == 422


def test_request_fields_take_their_own_json_type_only(url: str) -> None:
    for bad in ({"human": "yes"}, {"seed": "3"}, {"weight_version": "3"}, {"examples": "true"}, {"seed": 3.0},
                {"exam": "5", "examples": False}, {"max_invalid_moves": "2"}):
        answer = reset(url, **bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"] == "ValidationError", answer.text
        assert any(answer.json()["detail"].startswith(field) for field in bad), answer.text
    assert reset(url, seed=3, human=True, examples=1).status_code == 200  # an integer stands for a float
    assert httpx.post(f"{url}/step", json={"episode_id": 7, "action": {"guess": "crane"}}).status_code == 422
    assert httpx.post(f"{url}/step", json={"episode_id": "x", "action": {"guess": 12345}}).status_code == 422
    assert httpx.post(f"{url}/close", json={"episode_id": 7}).status_code == 422
    with ws_connect(url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": "3"}}))
        answer = json.loads(ws.recv())
        assert answer["type"] == "error" and answer["data"]["code"] == "VALIDATION_ERROR", answer


def test_an_exam_game_with_examples_is_refused_by_the_env(url: str) -> None:
    for examples in (True, 0.5, 1):
        answer = reset(url, exam=3, examples=examples)
        assert answer.status_code == 422 and "an exam game shows no examples" in answer.text, answer.text
    plain = reset(url, exam=3).json()["observation"]  # examples left out: none, as an exam shows
    assert plain["example"] is None and "for example" not in plain["message"]
    assert reset(url, exam=3, examples=0).json()["observation"]["example"] is None
    with ws_connect(url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"exam": 0, "examples": True}}))
        answer = json.loads(ws.recv())
        assert answer["type"] == "error" and "an exam game shows no examples" in answer["data"]["message"], answer
