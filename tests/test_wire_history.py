"""The trainer's history file: what it holds round-trips, and a file written by a stranger is checked record by
record (one bad record loses that record, a file that is not a history is refused in one line)."""

from __future__ import annotations

import json

import pytest

from wire.history import MAX_HISTORY_BYTES, HistoryFileError, decode_history, encode_history, up_to
from wire.trainer import Anchor, Payload, StepRecord, TrainerHistory


def step(n: int, version: int | None = None, **changes: object) -> StepRecord:
    record = StepRecord(step=n, version=n if version is None else version, reward=-0.1 * n, win_rate=0.0,
                        valid_rate=0.5, letters=1.25, step_s=40.0, cpu_s=70.0, publish_s=0.05, wait_s=3.0,
                        groups=[f"fleet/groups/r.s.b.{n:08d}.json"], staleness={0: 6, 1: 2}, ratio_mean=1.0,
                        at=1.7e9 + 40 * n)
    return record.model_copy(update=changes)


def payload(version: int) -> Payload:
    return Payload(version=version, delta_bytes=900_000, raw_bytes=6_000_000, dense_bytes=269_000_000,
                   changed=1_000_000, total=134_000_000, at=1.7e9 + version)


HISTORY = TrainerHistory(steps=[step(1), step(2), step(3, version=2), step(4, version=3)],
                         payloads=[payload(2), payload(3)], anchors=[Anchor(version=1, bytes=269_000_000, at=1.7e9)])


def test_a_history_round_trips_whole() -> None:
    decoded = decode_history(encode_history(HISTORY))
    assert decoded.history == HISTORY and decoded.skipped == {} and decoded.first_problem is None
    assert json.loads(encode_history(HISTORY))["format"] == "trainer-history"


def test_each_bad_record_is_refused_alone_and_counted() -> None:
    envelope = json.loads(encode_history(HISTORY))
    steps = envelope["history"]["steps"]
    steps.insert(1, {**steps[0], "step": 1})  # a step number again
    steps.append({**steps[-1], "step": 9, "version": 1})  # a version going back
    steps.append({**steps[-2], "step": 10, "step_s": -3.0})  # a negative duration
    steps.append({**steps[-3], "step": 11, "letters": "many"})  # not a number
    steps.append({"step": 12})  # fields missing
    steps.append({**steps[-5], "step": 10**30})  # a count no trainer reaches
    envelope["history"]["payloads"].append({**envelope["history"]["payloads"][-1]})  # the same version twice
    envelope["history"]["anchors"] = "nope"
    decoded = decode_history(json.dumps(envelope).encode())
    assert decoded.history.steps == HISTORY.steps and decoded.history.payloads == HISTORY.payloads
    assert decoded.history.anchors == []
    assert decoded.skipped == {"steps": 6, "payloads": 1, "anchors": 1}
    assert decoded.first_problem == "steps[1]: step 1 after step 1"


def test_a_file_that_is_not_a_history_is_refused_in_one_line() -> None:
    good = encode_history(HISTORY)
    cases = [
        (good[: len(good) // 2], "not whole JSON (torn or corrupt)"),
        (b'{"format": "trainer-history", "format_version": 1, "history": {"steps": [NaN]}}', "not whole JSON"),
        (b"[1, 2, 3]", "not a trainer-history file"),
        (json.dumps({"format": "fleet-run/1", "history": {}}).encode(), "not a trainer-history file"),
        (good.replace(b'"format_version":1', b'"format_version":7'), "format version 7; this trainer reads 1"),
        (b" " * (MAX_HISTORY_BYTES + 1), f"more than the {MAX_HISTORY_BYTES} a history may hold"),
    ]
    for data, message in cases:
        with pytest.raises(HistoryFileError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
            decode_history(data, "trainer/history.json")
        assert "\n" not in str(error.value) and str(error.value).startswith("trainer/history.json: ")


def test_records_of_versions_never_committed_are_dropped() -> None:
    kept = up_to(HISTORY, 2)
    assert [s.step for s in kept.steps] == [1, 2, 3] and [p.version for p in kept.payloads] == [2]
    assert kept.anchors == HISTORY.anchors
    assert up_to(HISTORY, 0) == TrainerHistory(steps=[], payloads=[], anchors=[])  # an empty bucket: nothing holds
