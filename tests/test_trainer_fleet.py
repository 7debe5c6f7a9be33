"""The trainer's side of the fleet against real buckets (a folder, and S3 through `rclone serve s3`): groups
taken oldest first and deleted, stale ones dropped, bad ones refused, nothing used twice, a wait that
ends when groups arrive or the session stops, and the heartbeats read into the fleet table."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from delta import Bucket
from delta.storage import RetryPolicy
from tests.test_wire_fleet import game, group
from trainer_space.config import TrainerConfig
from trainer_space.fleet import FleetMonitor, FleetRollouts, FleetRun
from fleet.liveness import GONE_AFTER_S
from trainer_space.rollouts import RolloutsStopped
from wire.fleet import GameGroup, Heartbeat, RunState, ServerState, encode, group_path
from fleet.bucket import FleetBucket
from wire.fleet_checks import max_group_bytes

CONFIG = TrainerConfig(bucket="unused", rollout_url=None, model="unused", games_per_step=4, num_generations=2,
                       max_staleness=1)


@pytest.fixture(params=["local", "s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> FleetBucket:
    if request.param == "local":
        return FleetBucket(str(tmp_path / "bucket"))
    server = request.getfixturevalue("rclone_s3")
    return FleetBucket(Bucket.open(f"s3://{server.bucket}", **server.storage_options()))


def rollouts(bucket: FleetBucket, version: list[int], stop: threading.Event | None = None) -> FleetRollouts:
    run = FleetRun(CONFIG, bucket, run_id="run-1")
    assert run.send(RunState.RUNNING, version[0])
    return FleetRollouts(CONFIG, run, lambda: version[0], stop)


def written(bucket: FleetBucket, g: GameGroup) -> GameGroup:
    bucket.write_group(g)
    return g


def test_a_step_takes_the_oldest_groups_and_each_group_once(bucket: FleetBucket) -> None:
    version = [3]
    fleet = rollouts(bucket, version)
    groups = [written(bucket, group(seq=i, version=v)) for i, v in enumerate([3, 2, 3, 2])]
    first = fleet.take(2)
    assert [g.seq for g in first] == [1, 3]  # version 2 before version 3
    assert {f.path for f in bucket.list_groups()} == {groups[0].path, groups[2].path}  # taken ones deleted
    assert fleet.last_step.staleness == {1: 4}
    second = fleet.take(2)
    assert [g.seq for g in second] == [0, 2]
    assert bucket.list_groups() == []
    assert fleet.counts.totals().games == 8 and fleet.histogram == {1: 4, 0: 4}


def test_stale_groups_are_dropped_and_bad_ones_refused_never_trained_on(bucket: FleetBucket) -> None:
    version = [5]
    fleet = rollouts(bucket, version)
    fresh = [written(bucket, group(seq=i, version=4)) for i in range(2)]
    written(bucket, group(seq=2, version=3))  # 2 versions behind, bound 1: dropped
    written(bucket, group(run="run-0", seq=3, version=5))  # an earlier trainer process's run
    bucket.bucket.write(group_path("run-1", "srv-a", "b00t", 4), encode(group(seq=4))[:100])  # torn
    edited = encode(group(seq=5)).replace(b'"reward":0.25', b'"reward":1.25', 1)
    bucket.bucket.write(group_path("run-1", "srv-a", "b00t", 5), edited)  # corrupt
    bucket.write_group(group(seq=6, version=5, games=3))  # not the run's group size
    taken = fleet.take(2)
    assert [g.seq for g in taken] == [0, 1] == [g.seq for g in fresh]
    totals = fleet.counts.totals()
    assert (totals.games, totals.dropped, totals.refused) == (4, 2, 4)
    assert fleet.last_step.dropped == 2 and fleet.last_step.refused == 4
    assert bucket.list_groups() == []  # everything judged is deleted


def test_a_step_waits_for_its_groups_and_says_so(bucket: FleetBucket) -> None:
    version = [0]
    fleet = rollouts(bucket, version)
    written(bucket, group(seq=0, version=0))
    result: list[list[GameGroup]] = []
    waiter = threading.Thread(target=lambda: result.append(fleet.take(2)))
    waiter.start()
    deadline = time.monotonic() + 20
    while not (fleet.waiting and fleet.ready == 1):
        assert time.monotonic() < deadline, "the step never said it waits with one group ready"
        time.sleep(0.05)
    written(bucket, group(seq=1, version=0))
    waiter.join(20)
    assert [g.seq for g in result[0]] == [0, 1] and not fleet.waiting
    assert fleet.last_step.waited_s > 0


def test_a_stop_ends_the_wait(tmp_path: Path) -> None:
    stop = threading.Event()
    fleet = rollouts(FleetBucket(str(tmp_path / "b")), [0], stop)
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(RolloutsStopped):
        fleet.take(1)


def test_a_group_whose_delete_failed_is_not_used_again(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "b"))
    fleet = rollouts(bucket, [0])
    g = written(bucket, group(seq=0, version=0))
    written(bucket, group(seq=1, version=0))

    def failing_delete(paths: list[str]) -> None:
        raise OSError("the bucket refused the delete")

    real_delete, bucket.delete = bucket.delete, failing_delete
    fleet.take(1)
    assert g.path in {f.path for f in bucket.list_groups()}  # still there
    bucket.delete = real_delete
    written(bucket, group(seq=2, version=0))
    second = fleet.take(2)
    assert g.path not in {x.path for x in second}
    assert {f.path for f in bucket.list_groups()} == set()  # the failed delete was done on the next look


def test_the_run_settings_tell_the_servers_the_trainer_s_settings(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "b"))
    run = FleetRun(CONFIG, bucket)
    assert run.send(RunState.PAUSED, 7)
    settings = bucket.read_run()
    assert (settings.run_id, settings.state, settings.trainer_version) == (run.run_id, RunState.PAUSED, 7)
    assert (settings.num_generations, settings.groups_per_step, settings.max_pending_groups) == (2, 2, 2)
    assert settings.sampling.max_tokens == CONFIG.max_tokens and settings.sampling.reply_prefix == CONFIG.reply_prefix


def test_an_unreachable_bucket_leaves_the_run_unsent_until_a_later_try(own_rclone_s3) -> None:
    rclone_s3 = own_rclone_s3
    bucket = FleetBucket(Bucket.open("s3://fleet-test", retry=RetryPolicy(attempts=1), **rclone_s3.storage_options()))
    run = FleetRun(CONFIG, bucket)
    rclone_s3.stop()
    try:
        assert not run.send(RunState.RUNNING, 1)
        assert run.unsent and "fleet-test" in (run.last_error or "")
    finally:
        rclone_s3.start()
    run.resend()
    assert not run.unsent and bucket.read_run().state == RunState.RUNNING


def test_the_monitor_lists_each_server_and_marks_a_silent_one_gone(tmp_path: Path, monkeypatch) -> None:
    bucket = FleetBucket(str(tmp_path / "b"))
    clock = [1000.0]
    monkeypatch.setattr("fleet.liveness.time.monotonic", lambda: clock[0])
    monitor = FleetMonitor(bucket)

    def beat(server: str, n: int) -> None:
        bucket.write_heartbeat(Heartbeat(server_id=server, boot="b", beat=n, run_id="run-1",
                                         state=ServerState.PRODUCING, version=4, games_per_min=12.5, groups_written=n,
                                         idle_share=0.1, updated_at=0.0))

    beat("a", 1)
    beat("b", 1)
    monitor.refresh()
    assert [(s.id, s.state, s.version) for s in monitor.servers()] == [("a", "producing", 4), ("b", "producing", 4)]
    clock[0] += GONE_AFTER_S + 1
    beat("a", 2)  # a keeps beating, b went silent
    monitor.refresh()
    assert {s.id: s.state for s in monitor.servers()} == {"a": "producing", "b": "gone"}
    assert {s.id: s.last_seen_s for s in monitor.servers()}["b"] > GONE_AFTER_S


def test_the_monitor_says_which_servers_check_the_trainers_signature(tmp_path: Path) -> None:
    """Each heartbeat says whether its server checks the weights and run settings, and with which key: the monitor
    compares that key with the trainer's own (or the one it hands over from); an older server's `fleet-heartbeat/1`
    is still listed, its trust unknown."""
    from delta import SigningKey, Trust

    key, old, stranger = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    bucket = FleetBucket(str(tmp_path / "b"), signing_key=key, trust=Trust.own("file:///b", key.public, [old.public]))
    monitor = FleetMonitor(bucket)
    for server, trust in (("mine", {"authenticated": True, "trusted_key": key.public.fingerprint}),
                          ("old", {"authenticated": True, "trusted_key": old.public.fingerprint}),
                          ("stranger", {"authenticated": True, "trusted_key": stranger.public.fingerprint}),
                          ("loose", {"authenticated": False}), ("older", {})):
        bucket.write_heartbeat(Heartbeat(server_id=server, boot="b", beat=1, run_id="run-1",
                                         state=ServerState.PRODUCING, version=4, games_per_min=1.0, groups_written=1,
                                         idle_share=0.1, updated_at=0.0, **trust))
    # An older server writes the first version of the heartbeat: the same body without the fields of its trust.
    written = json.loads(bucket.bucket.read("fleet/servers/older.json"))
    body = {k: v for k, v in written["body"].items() if k not in ("authenticated", "trusted_key")}
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    bucket.bucket.write("fleet/servers/older.json", json.dumps(
        {"kind": "fleet-heartbeat/1", "sha256": hashlib.sha256(raw).hexdigest(), "body": body}).encode())
    monitor.refresh()
    seen = {s.id: (s.authenticated, s.trusts_trainer, s.weights) for s in monitor.servers()}
    assert seen == {"mine": (True, True, ("checked", False)), "old": (True, True, ("checked", False)),
                    "stranger": (True, False, (f"another key {stranger.public.fingerprint[:19]}…", True)),
                    "loose": (False, None, ("UNAUTHENTICATED", True)), "older": (None, None, ("—", False))}

# -- issue 37: files that must never reach a step, counted by reason; bounded memory; no group ends a run ----------


def test_every_crafted_group_is_refused_and_counted_by_reason_before_a_step_sees_it(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "b"), secret="rollout-token")
    version = [5]
    run = FleetRun(CONFIG, bucket, run_id="run-1")
    run.know_vocabulary(100)
    assert run.send(RunState.RUNNING, 5) and bucket.read_run().vocab_size == 100
    fleet = FleetRollouts(CONFIG, run, lambda: version[0])

    def crafted(seq: int, **game) -> GameGroup:
        g = group(seq=seq, version=4)
        return g.model_copy(update={"games": [x.model_copy(update=game) for x in g.games]})

    bucket.write_group(crafted(0, completion_ids=[0, 1, 2, 10**6]))  # beyond the vocabulary
    bucket.write_group(crafted(1, versions=[4, 10**12]))  # a version far ahead: never a negative staleness
    bucket.write_group(crafted(2, prompt_ids=list(range(90)) * 30))  # longer than a game of the run may be
    FleetBucket(bucket.bucket).write_group(group(seq=3, version=4))  # unsigned: written without the token
    body = group(seq=4, version=4).model_dump(mode="json")
    body["games"][0]["logprobs"] = ["NaN"] * 4  # strings are not numbers
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    bucket.bucket.write(group_path("run-1", "srv-a", "b00t", 4), json.dumps(
        {"kind": "fleet-group/1", "sha256": hashlib.sha256(raw).hexdigest(), "body": body,
         "hmac": hmac.new(bucket.key, b"fleet-group/1\n" + raw, hashlib.sha256).hexdigest()}).encode())
    bucket.bucket.write(group_path("run-1", "srv-a", "b00t", 5), b" " * (max_group_bytes(run.settings(
        RunState.RUNNING)) + 1))  # larger than any group of the run: refused unread
    good = [bucket.write_group(group(seq=s, version=4)) for s in (6, 7)]
    taken = fleet.take(2)
    assert [g.path for g in taken] == good
    assert fleet.refused == {"token id out of the vocabulary": 1, "version ahead of the trainer": 1,
                             "not the run's shape": 1, "unsigned or forged": 1, "invalid fields": 1, "too large": 1}
    assert fleet.counts.totals().refused == 6 and bucket.list_groups() == []


def test_the_groups_held_in_memory_stay_within_the_pending_bound_oldest_first(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "b"))
    version = [12]
    config = replace(CONFIG, max_staleness=11)  # pending bound: 2 groups a step x 10
    fleet = rollouts(bucket, version)
    fleet.config = config
    big = [game(version=0).model_copy(update={"prompt_ids": list(range(1800))}) for _ in range(2)]
    paths = []
    for seq in range(24):  # newest first in the listing's order: the oldest are read last
        g = group(seq=seq, version=12 - seq // 2).model_copy(update={"games": [
            x.model_copy(update={"versions": [12 - seq // 2] * 2}) for x in big]})
        paths.append(bucket.write_group(g))
    tracemalloc.start()
    try:
        held = bucket.read_group(paths[0])  # what one group costs in memory, read and kept
        one = tracemalloc.get_traced_memory()[0]
        del held
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        taken = fleet.take(2)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert [g.seq for g in taken] == [22, 23]  # the two oldest (version 1), though listed last
    assert peak < 6 * one, f"{peak / one:.1f} groups' worth held at the peak; 24 are in the bucket, the bound is 2"
    assert [g.seq for g in fleet.take(2)] == [20, 21]


class _Tokenizer:
    """Decodes like a tokenizer, but fails on token id 66 (a bug or an id it cannot decode)."""

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        if any(66 in row for row in rows):
            raise OverflowError("out of range integral type conversion attempted")
        return ["x" * len(row) for row in rows]


def test_a_group_that_fails_on_its_way_into_a_step_is_refused_and_the_step_takes_another(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "b"))
    run = FleetRun(CONFIG, bucket, run_id="run-1")
    assert run.send(RunState.RUNNING, 3)
    fleet = FleetRollouts(CONFIG, run, lambda: 3, tokenizer=_Tokenizer())
    bad = group(seq=0, version=2)
    bad = bad.model_copy(update={"games": [bad.games[0].model_copy(update={"prompt_ids": [66]}), bad.games[1]]})
    bucket.write_group(bad)  # the oldest: tried first
    good = [bucket.write_group(group(seq=s, version=3)) for s in (1, 2)]
    columns = fleet(["wordle-seed:1"] * 4)
    assert len(columns["prompt_ids"]) == 4 and [p for p in fleet.last_step.groups] == good
    assert fleet.refused == {"unexpected error": 1} and bucket.list_groups() == []


def test_a_step_records_the_share_of_its_messages_that_showed_an_example(tmp_path: Path) -> None:
    """What the landing page shows beside the training valid-guess rate: a valid guess there may be a copy."""
    bucket = FleetBucket(str(tmp_path / "bucket"))
    fleet = rollouts(bucket, [3])
    shown = game().model_copy(update={"examples": ["crane", "stood"]})
    half = game().model_copy(update={"examples": ["crane", ""]})
    bucket.write_group(group(seq=0).model_copy(update={"games": [shown, half]}))
    bucket.write_group(group(seq=1).model_copy(update={"games": [half, half]}))
    fleet.take(2)
    assert fleet.last_step.examples_shown == 5 / 8
    # beside it, what the run's schedule gave those games: the probability of v3, the version that started them
    assert fleet.last_step.examples_scheduled == pytest.approx(CONFIG.schedule.probability(3))
    bucket.write_group(group(seq=2))
    bucket.write_group(group(seq=3))
    fleet.take(2)
    assert fleet.last_step.examples_shown is None  # games that recorded no message: nothing to count
