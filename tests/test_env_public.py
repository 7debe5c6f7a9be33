"""The env as an anonymous visitor meets it, on a real server on loopback: per-address caps (429 with
Retry-After), a public pool apart from the token holders' (503 with Retry-After), no policy labels
without the token, bounded and strict input (413, 422 without echo), WebSocket frames of the wrong
kind, and OpenEnv's own client and validator."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from ._env_server import running_server

TOKEN = "public-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PER_CLIENT = 3
PUBLIC = 5


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    flags = ("--per-client", str(PER_CLIENT), "--public-sessions", str(PUBLIC), "--max-sessions", "4")
    with running_server("env", *flags, env={"ENV_TOKEN": TOKEN}) as base:
        yield base


def _close_all(client: httpx.Client, ids: list[str]) -> None:
    for eid in ids:
        assert client.post("/close", json={"episode_id": eid}).status_code == 200


def test_one_address_gets_a_few_games_then_429_with_retry_after(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        mine = [client.post("/reset").json()["observation"]["episode_id"] for _ in range(PER_CLIENT)]
        refused = client.post("/reset")
        assert refused.status_code == 429 and refused.json()["error"] == "ClientLimitError"
        assert 1 <= int(refused.headers["retry-after"]) <= 180
        assert refused.json()["detail"].startswith(f"too many live games from your address: {PER_CLIENT} of")
        # The rollout's games are untouched by anonymous caps: they draw on their own pool.
        trusted = client.post("/reset", json={"weight_version": 3}, headers=AUTH)
        assert trusted.status_code == 200 and trusted.json()["observation"]["player"] == "policy v3"
        _close_all(client, [*mine, trusted.json()["observation"]["episode_id"]])
        again = client.post("/reset")  # a closed game frees the slot
        assert again.status_code == 200
        _close_all(client, [again.json()["observation"]["episode_id"]])


def test_a_full_public_pool_answers_503_with_retry_after_and_spares_the_token_pool(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        ids: list[str] = []
        # Distinct loopback peers stand for distinct visitors (127.0.0.x all reach the server).
        for n in range(2, 2 + PUBLIC + 2):
            with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=f"127.0.0.{n}")) as peer:
                response = peer.post("/reset")
            if response.status_code != 200:
                break
            ids.append(response.json()["observation"]["episode_id"])
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert client.post("/reset", headers=AUTH).status_code == 200  # the rollout still plays
        _close_all(client, ids)


def test_1050_anonymous_resets_leave_the_token_holders_games_alone(url: str) -> None:
    answers: Counter[int] = Counter()
    opened: list[str] = []
    for n in range(30):  # 30 visitors (loopback peers), 35 resets each
        with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=f"127.0.1.{n + 1}")) as peer:
            for _ in range(35):
                response = peer.post("/reset")
                answers[response.status_code] += 1
                if response.status_code == 200:
                    opened.append(response.json()["observation"]["episode_id"])
                else:
                    assert int(response.headers["retry-after"]) >= 1
    assert answers[200] == PUBLIC and answers[429] + answers[503] == 1050 - PUBLIC, answers
    with httpx.Client(base_url=url) as client:
        trusted = [client.post("/reset", json={"weight_version": 2}, headers=AUTH) for _ in range(2)]
        assert [r.json()["observation"]["player"] for r in trusted] == ["policy v2"] * 2
        _close_all(client, [*opened, *(r.json()["observation"]["episode_id"] for r in trusted)])


def test_anonymous_visitors_cannot_label_games_as_the_policy(url: str) -> None:
    forged = httpx.post(f"{url}/reset", json={"weight_version": 10**4200 % 2**62})
    assert forged.status_code == 403 and "needs the env token" in forged.json()["detail"]
    wrong = httpx.post(f"{url}/reset", json={"weight_version": 1}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    anonymous = httpx.post(f"{url}/reset", json={"human": False}).json()["observation"]
    assert anonymous["player"] == "human"
    httpx.post(f"{url}/close", json={"episode_id": anonymous["episode_id"]})
    assert all(not s["player"].startswith("policy v1") for s in httpx.get(f"{url}/stats").json())


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"seed": NaN}', 422),
        (b'{"seed": Infinity}', 422),
        (b'{"secret": "\\ud800"}', 422),
        (b'{"seed": 1e400}', 422),
        (b'{"seed": ' + str(10**4200).encode() + b"}", 422),
        (b'{"weight_version": 9223372036854775808}', 422),
        (b"\xff\xfe not utf-8", 422),
        (b"[" * 5000 + b"]" * 5000, 422),
    ],
    ids=["nan", "infinity", "lone-surrogate", "float-overflow", "huge-int", "int-over-63-bits", "not-utf8", "deep"],
)
def test_bad_json_gets_a_short_422_never_a_500(url: str, body: bytes, status: int) -> None:
    response = httpx.post(f"{url}/reset", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status and len(response.content) < 2000


def test_a_huge_body_is_refused_with_413_and_never_echoed(url: str) -> None:
    huge = {"episode_id": "x", "action": {"guess": "a" * 5_000_000}}
    response = httpx.post(f"{url}/step", json=huge)
    assert response.status_code == 413 and len(response.content) < 500

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"episode_id": "x", "action": {"guess": "'
        for _ in range(100):
            yield b"a" * 65536
        yield b'"}}'

    streamed = httpx.post(f"{url}/step", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    long_guess = httpx.post(f"{url}/step", json={"episode_id": "x", "action": {"guess": "a" * 40_000}})
    assert long_guess.status_code == 422 and len(long_guess.content) < 2000


def test_websocket_frames_of_the_wrong_kind_get_an_error_message(url: str) -> None:
    with connect(url.replace("http", "ws") + "/ws") as ws:
        def answer(frame: str | bytes) -> dict[str, Any]:
            ws.send(frame)
            return json.loads(ws.recv(timeout=10))

        assert answer(b"\x00\x01binary")["data"]["code"] == "INVALID_JSON"
        assert answer('{"type": "reset", "data": {"seed": NaN}}')["data"]["code"] == "INVALID_JSON"
        assert answer('{"type": "reset", "data": [1]}')["data"]["code"] == "VALIDATION_ERROR"
        assert answer('{"type": "reset", "data": {"weight_version": 2}}')["data"]["code"] == "FORBIDDEN"
        assert answer("[" * 5000)["type"] == "error"
        started = answer(json.dumps({"type": "reset", "data": {"seed": 4}}))
        assert started["data"]["observation"]["player"] == "human"
        assert answer(json.dumps({"type": "close"}))["type"] == "closed"


def test_openenv_client_plays_over_the_websocket(url: str) -> None:
    from openenv.core.generic_client import GenericEnvClient

    async def play() -> tuple[Any, Any]:
        async with GenericEnvClient(base_url=url) as env:
            started = await env.reset(secret="crane")
            moved = await env.step({"guess": "<guess>crane</guess>"})
            return started, moved

    started, moved = asyncio.run(asyncio.wait_for(play(), timeout=30))
    assert started.done is False and started.observation["player"] == "human"
    assert moved.done is True and moved.observation["won"] is True


def test_openenv_validate_passes_every_check(url: str) -> None:
    cli = shutil.which("openenv")
    assert cli, "the openenv command is missing: pip install -r requirements-test.txt (openenv-core)"
    run = subprocess.run([cli, "validate", "--url", url], capture_output=True, text=True, timeout=120)
    report = json.loads(run.stdout)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert run.returncode == 0 and report["passed"] and not failed, failed


def test_mcp_answers_json_rpc(url: str) -> None:
    listed = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).json()
    assert listed == {"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}
    unknown = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "x" * 10_000}).json()
    assert unknown["error"]["code"] == -32601 and len(json.dumps(unknown)) < 500
    assert httpx.post(f"{url}/mcp", content=b"{nope").json()["error"]["code"] == -32700
