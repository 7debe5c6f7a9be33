"""One request model and one shape of refusal across the three apps' HTTP APIs (`webguard.RequestBody`,
`webguard.answers`): every route that takes a body refuses a malformed or mistyped one with 422 and
``{"detail": "<one line>", "error": "<class>"}``, never coerces a string into a number, and never answers FastAPI's
list-shaped ``detail``. The apps run in-process (FastAPI's TestClient); the routes are refused before they reach the
app's logic, so stubs stand for the rollout service and the trainer session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from env_space.api import build_api as env_api
from env_space.history import GameHistory
from env_space.sessions import SessionStore
from env_space.words import load_word_lists
from rollout_space.api import build_api as rollout_api
from trainer_space.api import build_api as trainer_api
from trainer_space.session import AccessDenied

ROLLOUT_TOKEN = "rollout-token"
OWNER = "owner-token"


class _Service:
    """The rollout service as far as a body that passed its checks reaches: nothing played, nothing generated."""

    def play(self, games: Any, params: Any, on_turn: Any = None) -> list:
        return []

    def generate(self, prompts: Any, params: Any) -> list:
        raise AssertionError("not reached by these tests")


class _Session:
    def control(self, action: str, token: str | None) -> str:
        if token != OWNER:
            raise AccessDenied("this needs the owner token")
        return "running"


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, TestClient]]:
    store = SessionStore(load_word_lists(), GameHistory())
    env, rollout, trainer = env_api(store), rollout_api(_Service(), token=ROLLOUT_TOKEN), trainer_api(_Session())
    with TestClient(env) as e, TestClient(rollout) as r, TestClient(trainer) as t:
        yield {"env": e, "rollout": r, "trainer": t}


#: Every route that takes a body: (app, path, a body it takes, the field mistyped below, its value as a string).
ROUTES = [
    ("env", "/reset", {"seed": 3}, "seed", "3"),
    ("env", "/step", {"episode_id": "x", "action": {"guess": "crane"}}, "episode_id", None),
    ("env", "/close", {"episode_id": "x"}, "episode_id", None),
    ("rollout", "/generate", {"prompts": ["hello"], "max_tokens": 4}, "max_tokens", "4"),
    ("rollout", "/rollout", {"games": [{"seed": 1}], "max_tokens": 8}, "max_tokens", "8"),
    ("trainer", "/control", {"action": "pause", "token": OWNER}, "action", None),
]
HEADERS = {"rollout": {"Authorization": f"Bearer {ROLLOUT_TOKEN}"}}


def _refused(response: Any, status: int, error: str) -> str:
    """The refusal's detail, once its status and shape are checked."""
    assert response.status_code == status, response.text
    answer = response.json()
    assert set(answer) == {"detail", "error"} and answer["error"] == error, answer
    assert isinstance(answer["detail"], str) and "\n" not in answer["detail"] and answer["detail"], answer
    return answer["detail"]


@pytest.mark.parametrize(("app", "path", "body", "field", "text"), ROUTES, ids=[f"{a}{p}" for a, p, *_ in ROUTES])
def test_a_mistyped_field_is_refused_in_the_one_shape(clients, app, path, body, field, text) -> None:
    client, headers = clients[app], HEADERS.get(app, {})
    mistyped = {**body, field: text if text is not None else 7}  # "8" is no integer, 7 no string
    detail = _refused(client.post(path, json=mistyped, headers=headers), 422, "ValidationError")
    assert detail.startswith(f"{field}: "), detail
    assert text is None or text not in detail.split(": ", 1)[1]  # the input is never echoed


@pytest.mark.parametrize(("app", "path"), [(a, p) for a, p, *_ in ROUTES], ids=[f"{a}{p}" for a, p, *_ in ROUTES])
def test_malformed_json_nan_and_a_body_over_the_limit_are_refused_in_the_one_shape(clients, app, path) -> None:
    client, headers = clients[app], {"Content-Type": "application/json", **HEADERS.get(app, {})}
    _refused(client.post(path, content=b'{"seed": ', headers=headers), 422, "InvalidJSON")
    _refused(client.post(path, content=b'{"seed": NaN}', headers=headers), 422, "InvalidJSON")
    _refused(client.post(path, content=b" " * (9 * 1024 * 1024), headers=headers), 413, "BodyTooLarge")


def test_the_rollout_refuses_max_tokens_as_a_string_and_plays_with_a_number(clients) -> None:
    def rollout(**fields: Any) -> Any:
        return clients["rollout"].post("/rollout", json={"games": [{"seed": 1}], **fields}, headers=HEADERS["rollout"])

    assert _refused(rollout(max_tokens="8"), 422, "ValidationError").startswith("max_tokens: ")
    played = rollout(max_tokens=8)
    assert played.status_code == 200 and played.json() == {"trajectories": []}
    assert rollout(max_tokens=8, temperature=1).status_code == 200  # an integer stands for a float


def test_unknown_fields_are_refused_by_rollout_and_trainer_and_ignored_by_the_env(clients) -> None:
    assert clients["env"].post("/reset", json={"seed": 3, "openenv_extra": 1}).status_code == 200
    refused = clients["trainer"].post("/control", json={"action": "pause", "force": True})
    assert _refused(refused, 422, "ValidationError").startswith("force: ")
    body = {"games": [{"seed": 1, "word": "x"}]}
    refused = clients["rollout"].post("/rollout", json=body, headers=HEADERS["rollout"])
    assert _refused(refused, 422, "ValidationError").startswith("games.0.word: ")


def test_every_other_refusal_has_the_one_shape_too(clients) -> None:
    unauthorized = clients["rollout"].post("/rollout", json={"games": [{"seed": 1}]})
    assert "ROLLOUT_TOKEN" in _refused(unauthorized, 401, "Unauthorized")
    _refused(clients["trainer"].post("/control", json={"action": "pause"}), 403, "AccessDenied")
    gone = clients["env"].post("/step", json={"episode_id": "gone", "action": {"guess": "crane"}})
    _refused(gone, 404, "SessionNotFoundError")
    for client in clients.values():
        _refused(client.get("/no-such-route"), 404, "NotFound")
    _refused(clients["env"].get("/games", params={"limit": "many"}), 422, "ValidationError")
