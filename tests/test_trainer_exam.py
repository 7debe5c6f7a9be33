"""The trainer's side of the exam: it tells the servers how to examine and which examples to show (the run's
settings), reads the exam records from the bucket in a thread (a bad file refused, an unreadable bucket
reported), and serves them in /status and /history."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from delta.errors import BucketUnreachableError
from tests._published import publish_versions
from tests.test_wire_exam import record
from trainer_space import TrainerConfig, build_session
from trainer_space.api import build_api
from trainer_space.exam import ExamWatch
from trainer_space.fleet import FleetRun
from wire.curriculum import ExampleMode, ExampleSchedule
from wire.exam import ExamRecord, ExamSettings
from fleet.exams import ExamShelf
from wire.fleet import RunState
from fleet.bucket import FleetBucket
from wire.trainer import TrainerHistory


def write_exams(bucket: str, *versions: int) -> None:
    shelf = ExamShelf(bucket)
    for v in versions:
        shelf.write(ExamRecord.model_validate(record(version=v)))


def test_the_run_tells_every_server_the_exam_and_the_examples(tmp_path) -> None:
    config = TrainerConfig(str(tmp_path / "b"), None, "m", max_turns=4, seed=3, exam_every=7, exam_games=8,
                           fade_start=2, fade_end=12)
    bucket = FleetBucket(config.bucket)
    FleetRun(config, bucket, run_id="r").send(RunState.RUNNING, 0)
    run = bucket.read_run()
    assert run.exam == ExamSettings(every=7, games=8, turns=4, temperature=1.0, seed=3)
    assert run.sampling.examples == ExampleSchedule(start=2, end=12)
    greedy = TrainerConfig("b", None, "m", exam_greedy=True, exam_turns=6)
    assert (greedy.exam.temperature, greedy.exam.turns) == (0.0, 6)
    assert TrainerConfig("b", None, "m", exam_every=0).exam is None


@pytest.mark.parametrize("bad", [{"exam_every": -1}, {"exam_games": 0}, {"exam_games": 65}, {"exam_turns": 13}])
def test_exam_settings_out_of_range_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="exam"):
        TrainerConfig("b", None, "m", **bad)


def test_the_watch_reads_the_bucket_refuses_bad_files_and_survives_an_unreadable_bucket(tmp_path,
                                                                                        monkeypatch) -> None:
    bucket = str(tmp_path / "b")
    publish_versions(bucket, 5)
    write_exams(bucket, 0, 5, 6)
    (tmp_path / "b" / "exams" / "v0000000009.json").write_text("{not json")
    watch = ExamWatch(bucket)
    watch.refresh()
    assert [r.version for r in watch.records()] == [0, 5] and watch.last_error is None
    assert watch.refused() == {"torn or corrupt": 1, "version ahead of the trainer": 1}
    signed = ExamWatch(bucket, secret="this-start")  # the records were written unsigned: not this run's key
    signed.refresh()
    assert signed.records() == [] and signed.refused() == {"signed with another token": 3, "torn or corrupt": 1}


    def unreachable(prefix: str, max_age: float = 0.0) -> None:
        raise BucketUnreachableError("connection refused", url=bucket)

    monkeypatch.setattr(watch.shelf.bucket, "list", unreachable)
    watch.refresh()
    assert "connection refused" in watch.last_error and [r.version for r in watch.records()] == [0, 5]


def test_status_and_history_carry_the_exams(tmp_path) -> None:
    bucket = str(tmp_path / "b")
    publish_versions(bucket, 48)
    write_exams(bucket, *range(0, 52, 2))  # v50: ahead of the bucket, refused
    (tmp_path / "b" / "exams" / "v0000000049.json").write_text("{torn")
    session = build_session(TrainerConfig(bucket, "http://127.0.0.1:1", str(tmp_path)))
    try:
        deadline = time.monotonic() + 30
        while len(session.exams.records()) < 25:
            assert time.monotonic() < deadline, "the exams were not read"
            time.sleep(0.1)
        status = session.status()
        assert [r.version for r in status.exams] == list(range(10, 50, 2))  # the latest 20
        refused = {"torn or corrupt": 1, "version ahead of the trainer": 1}
        assert status.exams_refused == refused
        assert status.exam == session.config.exam and status.examples.mode == ExampleMode.FADING
        with TestClient(build_api(session)) as client:
            history = TrainerHistory.model_validate(client.get("/history").json())
        assert [r.version for r in history.exams] == list(range(0, 50, 2)) and history.exams_refused == refused
    finally:
        session.close()
