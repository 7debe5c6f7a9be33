"""The landing page's cards against apps that answer their status, something else, or nothing (each app a
real server on loopback)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from launcher.children import Child
from dashboard.examples import SCHEDULE, SHOWN
from launcher.landing import build_app
from launcher.landing import shown as card_fields
from trainer_space import TrainerConfig, build_session
from wire.env import GameKind, PlayerStats
from wire.rollout import RolloutStatus
from wire.trainer import FleetServer, StepRecord

from ._env_server import free_port, serving

ROLLOUT = RolloutStatus(version=3, latest_version=4, lag=1, engine="transformers", device="cpu", model="m",
                        bucket="b", env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                        tokens_served=10, games_played=1)


STATS = [PlayerStats(player="human", kind=GameKind.MATCH, games=1, wins=0).model_dump(),
         PlayerStats(player="human", games=2, wins=2).model_dump(),
         *(PlayerStats(player=f"policy v{v}", kind=kind, games=n, wins=w).model_dump()
           for v, kind, n, w in ((1, GameKind.TRAINING, 8, 0), (1, GameKind.EXAM, 16, 1), (2, GameKind.TRAINING, 4, 0),
                                 (2, GameKind.SHOWCASE, 3, 2)))]


def answering(body: Any) -> FastAPI:
    """An app whose ``/status``, ``/stats`` and ``/health`` answer `body`."""
    app = FastAPI()
    app.get("/status")(lambda: body)
    app.get("/stats")(lambda: body)
    app.get("/health")(lambda: body)
    return app


def ready(role: str, url: str) -> Child:
    return Child(role=role, host="127.0.0.1", port=int(url.rsplit(":", 1)[1]), args=[], log_path="", state="ready")


def cards(children: list[Child]) -> dict[str, dict[str, Any]]:
    with TestClient(build_app(children, "bucket")) as client:
        return {c["role"]: c for c in client.get("/api/status").json()["apps"]}


def test_cards_show_what_each_app_says_of_itself(tmp_path) -> None:
    trainer = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    with serving(answering(ROLLOUT.model_dump())) as rollout, serving(answering(trainer.model_dump())) as url, \
            serving(answering(STATS)) as env:
        shown = cards([ready("env", env), ready("rollout", rollout), ready("trainer", url)])
    assert shown["env"]["state"] == "ready" and shown["env"]["fields"] == [
        ["policy's training games", "12 finished, 0 won"], ["policy's exam games", "16 finished, 1 won"],
        ["policy's showcase games", "3 finished, 2 won"], ["people's games", "3 finished, 2 won"]]
    assert card_fields("env", b"[]") == [("games finished", "none yet")]
    assert shown["rollout"]["fields"] == [["weights version", 3], ["versions behind", 1], ["engine", "transformers"],
                                          ["syncs", 2]]
    producing = ROLLOUT.model_copy(update={"fleet_state": "waiting for step 1", "server_id": "r0"})
    assert card_fields("rollout", producing.model_dump_json())[2] == ("fleet state", "waiting for step 1")
    assert shown["trainer"]["fields"] == [["published version", "none yet"], ["progress", "step 0"],
                                          ["valid guesses (strict), last 5 steps", "—"],
                                          [SHOWN, "—"],
                                          [SCHEDULE, "100% of messages in games started by v0 (fading: every "
                                                     "message up to v0, none from v30)"],
                                          ["letters found of 5, last 5 steps", "—"], ["mean reward", "—"],
                                          ["training", "stopped"], ["resumed from version", "—"],
                                          ["last exam (held-out words, no examples)", "no exam yet"],
                                          ["exam: own valid words, trend", "—"]]
    assert shown["trainer"]["fleet"] == [] and shown["trainer"]["fleet_note"].startswith(
        "rollout fleet: no heartbeat in the bucket yet")


def test_the_fleet_line_tells_stopping_from_not_started(tmp_path) -> None:
    """Without heartbeats to show, the trainer's card says what the launcher knows of its rollout servers."""
    trainer = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    with serving(answering(trainer.model_dump())) as url:
        rollout = ready("rollout", f"http://127.0.0.1:{free_port()}")
        for state, note in (("starting", "rollout fleet: not started yet"), ("stopping", "rollout fleet: stopping"),
                            ("stopped", "rollout fleet: stopping")):
            rollout.state = state
            assert cards([rollout, ready("trainer", url)])["trainer"]["fleet_note"] == note
        trainer_child = ready("trainer", url)
        trainer_child.state = "stopping"
        rollout.state = "stopping"
        card = cards([rollout, trainer_child])["trainer"]
        assert (card["state"], card["fields"], card["fleet_note"]) == ("stopping", [], "rollout fleet: stopping")


def test_the_fleet_table_takes_each_servers_version_from_its_own_card(tmp_path) -> None:
    """The heartbeats trail the servers' own status: a server the launcher runs shows its card's version, and a
    restarting one says so with no version (not its new process's v0); a server run elsewhere keeps its heartbeat's."""
    beat = {"games_per_min": 1.0, "last_seen_s": 2.0, "idle_share": 0.0, "groups_written": 1, "run_id": "r",
            "last_error": None}
    key = "SHA256:" + "A" * 43
    trust = {"elsewhere": {"authenticated": False},  # --unauthenticated: a warning in its row
             "rollout": {"authenticated": True, "trusted_key": key, "trusts_trainer": True},
             "rollout-1": {}}  # an older server's heartbeat says nothing of its trust
    fleet = [FleetServer(id=name, version=2, state=state, **beat, **trust[name])
             for name, state in (("elsewhere", "producing"), ("rollout", "producing"), ("rollout-1", "no run"))]
    trainer = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    with serving(answering(trainer.model_copy(update={"fleet": fleet}).model_dump())) as url, \
            serving(answering(ROLLOUT.model_dump())) as rollout:
        restarting = ready("rollout", f"http://127.0.0.1:{free_port()}")
        restarting.name, restarting.state = "rollout-1", "restarting (restart 1 of at most 5)"
        rows = cards([ready("rollout", rollout), restarting, ready("trainer", url)])["trainer"]["fleet"]
    assert rows == [["elsewhere", 2, 1.0, "2 s ago", "producing", "⚠ UNAUTHENTICATED"],
                    ["rollout", 3, 1.0, "2 s ago", "producing", "checked"],
                    ["rollout-1", "—", 1.0, "2 s ago", "restarting (restart 1 of at most 5)", "—"]]


def test_the_trainer_card_shows_the_strict_rates_with_their_trend(tmp_path) -> None:
    status = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    steps = [StepRecord(step=n, version=n, reward=0.0, win_rate=0.0, valid_rate=0.2 if n <= 5 else 0.6,
                        letters=1.0 if n <= 5 else 1.5, step_s=50.0, cpu_s=90.0, publish_s=0.05, at=float(n))
             for n in range(1, 13)]
    status = status.model_copy(update={"step": 12, "step_s": 50.0, "recent": steps})
    fields = dict(card_fields("trainer", status.model_dump_json().encode()))
    assert fields["progress"] == "step 12"  # 988 steps to go at 50 s: no real end, no "12 / 1000"
    assert fields["valid guesses (strict), last 5 steps"] == "60% (up 40 pts over 12 steps)"
    assert fields["letters found of 5, last 5 steps"] == "1.50 (up 0.50 over 12 steps)"
    # Beside the valid-guess rate: how many of the games' messages offered an example to copy (dashboard.examples).
    labels = [label for label, _ in card_fields("trainer", status.model_dump_json().encode())]
    assert labels.index(SHOWN) == labels.index("valid guesses (strict), last 5 steps") + 1
    assert fields[SHOWN] == "—"  # steps without the share recorded (an older history)
    shown = [s.model_copy(update={"examples_shown": 0.5 if s.step <= 10 else 0.8}) for s in steps]
    fields = dict(card_fields("trainer", status.model_copy(update={"recent": shown}).model_dump_json().encode()))
    assert fields[SHOWN] == "62% of the messages of the games trained on"


def test_the_page_has_an_icon_and_shows_no_local_path(tmp_path) -> None:
    bucket = str(tmp_path / "cache" / "bucket")
    with TestClient(build_app([], bucket)) as client:
        page = client.get("/").text
        assert client.get("/favicon.ico").status_code == 200 and 'rel="icon"' in page
        assert str(tmp_path) not in page and "share one bucket (<code>local folder …/bucket</code>)" in page
        assert client.get("/api/status").json()["bucket"] == "local folder …/bucket"


def test_an_app_answering_something_else_gets_a_card_saying_so() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with serving(answering([1, 2, 3])) as listing, serving(answering({**ROLLOUT.model_dump(), "lag": "far"})) as wrong:
        shown = cards([ready("rollout", wrong), ready("trainer", listing), ready("env", dead)])
    assert shown["rollout"]["state"] == "answering something other than its status (1 field wrong)"
    assert shown["trainer"]["state"].startswith("answering something other than its status")
    assert shown["env"]["state"] == "not answering (ConnectError)"
    assert all(card["fields"] == [] for card in shown.values())


def test_the_trainer_card_shows_the_last_exam_and_its_trend(tmp_path) -> None:
    from tests.test_wire_exam import record, scores
    from wire.exam import ExamRecord

    status = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    exams = [ExamRecord.model_validate(record(version=0, scores=scores(own_rate=0.0, valid_rate=0.25, own=0))),
             ExamRecord.model_validate(record(version=5, scores=scores(own_rate=0.5, valid_rate=0.5, own=3,
                                                                      letters=1.75)))]
    fields = dict(card_fields("trainer", status.model_copy(update={"exams": exams}).model_dump_json().encode()))
    assert fields["last exam (held-out words, no examples)"] == (
        "v5: own words on 50% of moves (valid 50%) · 1.75 letters · 0 of 2 won")
    assert fields["exam: own valid words, trend"] == "50% (v0: 0%, up 50 pts over 2 exams)"
    off = dict(card_fields("trainer", status.model_copy(update={"exam": None}).model_dump_json().encode()))
    assert off["exam"] == "off (--exam-every 0)"
    assert "exam records not read" not in fields
    other = dict(card_fields("trainer", status.model_copy(update={"exams_refused": {"signed with another token": 2}})
                             .model_dump_json().encode()))
    assert other["exam records not read"].startswith("2 exam records signed with another token (not shown)")
    assert "ROLLOUT_TOKEN" in other["exam records not read"]  # what to do about it


def test_a_rollout_card_says_when_its_weights_are_unauthenticated_and_counts_what_the_trainer_did_not_sign() -> None:
    checked = ROLLOUT.model_copy(update={"refused": {"untrusted version": 2, "untrusted run settings": 1,
                                                    "bad adapter": 1}})
    fields = dict(card_fields("rollout", checked.model_dump_json().encode()))
    assert fields["refused (not signed by the trainer)"] == "run settings 1 · version 2" and "weights" not in fields
    unchecked = ROLLOUT.model_copy(update={"authenticated": False})
    assert dict(card_fields("rollout", unchecked.model_dump_json().encode()))["weights"] == (
        "UNAUTHENTICATED (the bucket's, whoever wrote them)")
