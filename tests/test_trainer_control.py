"""Owner-only control: start/pause/stop are refused without the owner's token, over HTTP and in the UI's path;
bodies are bounded (413) and strict (422)."""

from __future__ import annotations

import httpx
import pytest

from tests._env_server import free_port, running_server
from tests._trainer_stack import tiny_model
from trainer_space import TrainerConfig, TrainerState, build_session
from trainer_space.session import AccessDenied
from wire.trainer import ControlResponse, TrainerHistory, TrainerStatus


def test_http_control_needs_the_owner_token(tmp_path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # paused: nothing calls the rollout
    with running_server("trainer", "--bucket", str(tmp_path / "bucket"), "--model", tiny_model(str(tmp_path / "model")),
              "--rollout-url", dead, "--paused", "--owner-token", "s3cret") as url:
        assert httpx.get(f"{url}/status").json()["state"] == "paused"
        for kwargs in ({"json": {"action": "start"}}, {"json": {"action": "start", "token": "wrong"}},
                       {"json": {"action": "stop"}, "headers": {"Authorization": "Bearer wrong"}}):
            r = httpx.post(f"{url}/control", **kwargs)
            assert r.status_code == 403, r.text
            assert "owner token" in r.json()["detail"]
        assert httpx.get(f"{url}/status").json()["state"] == "paused"
        r = httpx.post(f"{url}/control", json={"action": "stop"}, headers={"Authorization": "Bearer s3cret"})
        assert (r.status_code, r.json()) == (200, {"state": "stopped"})
        assert httpx.post(f"{url}/control", json={"action": "reboot", "token": "s3cret"}).status_code == 422
        json_body = {"content-type": "application/json"}
        huge = httpx.post(f"{url}/control", content=b'{"token": "' + b"a" * 300_000 + b'"}', headers=json_body)
        assert huge.status_code == 413 and len(huge.content) < 500
        assert httpx.post(f"{url}/control", content=b'{"action": NaN}', headers=json_body).status_code == 422


def test_every_answer_is_its_typed_message(tmp_path) -> None:
    """/docs names each route's model and the JSON holds exactly its keys: a route drifting from its model
    fails here."""
    dead = f"http://127.0.0.1:{free_port()}"
    with running_server("trainer", "--bucket", str(tmp_path / "bucket"), "--model", tiny_model(str(tmp_path / "model")),
                        "--rollout-url", dead, "--paused", "--owner-token", "s3cret") as url:
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
        for path, method, model in [("/status", "get", TrainerStatus), ("/history", "get", TrainerHistory),
                                    ("/control", "post", ControlResponse)]:
            schema = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, path
        status = httpx.get(f"{url}/status").json()
        assert set(status) == set(TrainerStatus.model_fields)
        assert TrainerStatus.model_validate(status).state is TrainerState.PAUSED
        assert TrainerHistory.model_validate(httpx.get(f"{url}/history").json()) == TrainerHistory(steps=[], payloads=[])


def test_without_an_owner_token_nobody_controls(tmp_path) -> None:
    session = build_session(TrainerConfig(str(tmp_path), "http://127.0.0.1:1", str(tmp_path)), owner_token=None)
    session.pause()
    with pytest.raises(AccessDenied, match="no owner token is set"):
        session.control("start", "anything")
    with pytest.raises(AccessDenied, match="wrong or missing owner token"):
        build_session(session.config, owner_token="x").control("start", None)
    assert session.status().state == "paused"
