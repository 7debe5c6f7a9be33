"""Publisher: versions committed in order, coalescing, resume from the bucket, retries, several ranks."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from delta import Bucket
from delta import Publisher, PublisherConfig, Subscriber, SubscriberConfig, state_digest
from delta.signing import trainer_key
from delta import read_manifest
from delta.bucket.manifest import version_of_path
from delta.storage import RetryPolicy

from ._ports import free_port
from ._states import states_equal
from ._trainer import trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_versions_anchors_and_round_trip(tmp_path):
    states = trajectory(12)
    reader = Subscriber(tmp_path)
    with Publisher(str(tmp_path), PublisherConfig(anchor_every=5, keep_anchors=2)) as pub:
        for i, s in enumerate(states[1:], start=1):
            pub.publish(s)
            assert pub.flush(timeout=60)
            assert pub.last.version == i
            assert reader.sync() == i and states_equal(reader.state, s)
    manifest = read_manifest(Bucket.open(tmp_path))
    assert [v.version for v in manifest.anchors()] == [6, 11]  # 1 was dropped by retention
    assert [v.version for v in manifest.versions] == list(range(6, 13))
    assert all(v.delta for v in manifest.versions)  # anchors carry a delta too: live readers never need them
    assert [h.via for h in reader.status().history] == ["anchor"] + ["delta"] * 11


def _synced(reader: Subscriber) -> int | None:
    """`reader.sync()` in a thread, or a failure if it does not return in 30 s (a FIFO read hangs for good)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(reader.sync()), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the reader hangs"
    return done[0]


def test_a_folder_or_fifo_planted_at_a_manifest_name_stops_neither_the_publisher_nor_its_readers(tmp_path, caplog):
    """Anyone who writes to a folder bucket can make a folder at the next manifest's name, or a FIFO at one: the
    publisher skips the name in one line and commits at the next, restarts included; readers never see either."""
    states = trajectory(4)
    bucket = tmp_path / "bucket"
    manifests = bucket / "manifests"
    reader = Subscriber(str(bucket))
    with Publisher(str(bucket)) as pub:
        pub.publish(states[1])
        assert pub.flush(timeout=60)
        (manifests / "0000000002.json").mkdir()
        (manifests / "0000000002.json" / "0000000002.json").write_bytes(b"{}")
        os.mkfifo(manifests / "0000000009.json")
        assert _synced(reader) == 1
        with caplog.at_level(logging.WARNING, logger="delta.bucket.manifest"):
            pub.publish(states[2])
            assert pub.flush(timeout=60) and pub.last.version == 2
    skipped = [r.getMessage() for r in caplog.records if r.name == "delta.bucket.manifest"]
    assert len(skipped) == 1 and skipped[0].startswith("commit 2 skipped (write 'manifests/0000000002.json' in ")
    assert skipped[0].endswith("refused: a folder holds its name): committing as 3")
    assert read_manifest(Bucket.open(bucket)).commit == 3
    assert _synced(reader) == 2 and states_equal(reader.state, states[2])

    (manifests / "0000000004.json").mkdir()  # at the name a restarted publisher commits at
    with Publisher(str(bucket)) as pub:
        assert pub.last.version == 2
        pub.publish(states[3])
        assert pub.flush(timeout=60)
    assert read_manifest(Bucket.open(bucket)).commit == 5
    assert _synced(reader) == 3 and _synced(Subscriber(str(bucket))) == 3 and states_equal(reader.state, states[3])


def test_coalesces_when_uploads_fall_behind(tmp_path):
    states = trajectory(30)
    with Publisher(str(tmp_path)) as pub:
        assert pub.state_version == 0
        start = time.perf_counter()
        for s in states[1:]:
            pub.publish(s)
            assert pub.state_version >= 1  # the state handed in is ahead of what is committed until it lands
        blocked = time.perf_counter() - start
        assert pub.flush(timeout=60)
        assert pub.state_version == pub.last.version  # committed: the version the state has, coalesced steps one
    latest = pub.last.version
    assert latest < 30  # the background could not keep up with 30 back-to-back publishes
    assert blocked < 5.0
    reader = Subscriber(tmp_path)
    assert reader.sync() == latest and states_equal(reader.state, states[-1])  # the newest state always lands


def test_a_step_handed_in_while_the_last_uploads_counts_as_the_version_after_it(tmp_path):
    """While version 1 uploads, the next step waits behind it and becomes version 2: `state_version` says 2 (the
    trainer records each step under it), and 2 again for a third step that coalesces with the waiting one."""
    states = trajectory(4)
    gate = threading.Event()
    storage = Bucket.open(tmp_path)
    write = storage.write

    def held_write(path: str, data: bytes) -> None:  # the first version's files wait for the gate
        gate.wait(30)
        write(path, data)

    storage.write = held_write
    with Publisher(storage) as pub:
        pub.publish(states[1])
        deadline = time.monotonic() + 30
        while not pub._in_flight and time.monotonic() < deadline:  # the background thread took it
            time.sleep(0.01)
        assert pub.state_version == 1
        pub.publish(states[2])
        assert pub.state_version == 2
        pub.publish(states[3])  # coalesces with the step waiting
        assert pub.state_version == 2
        gate.set()
        assert pub.flush(timeout=60)
        assert pub.last.version == pub.state_version == 2
    reader = Subscriber(tmp_path)
    assert reader.sync() == 2 and states_equal(reader.state, states[3])


def test_resume_continues_numbering_and_checks_the_state(tmp_path):
    states = trajectory(6)
    with Publisher(str(tmp_path)) as pub:
        for s in states[1:4]:
            pub.publish(s)
            pub.flush()
    # The caller's base_state is not the bucket's latest: it is refused and the base pulled from the bucket.
    with Publisher(str(tmp_path), base_state=states[1]) as pub:
        assert pub.last.version == 3 and pub.last.state_hash == read_manifest(Bucket.open(tmp_path)).latest.state_hash
        assert pub.state_version == 3
        pub.publish(states[4])
        pub.flush()
    with Publisher(str(tmp_path), base_state=states[4]) as pub:
        pub.publish(states[5])
    manifest = read_manifest(Bucket.open(tmp_path))
    assert [(v.version, v.kind) for v in manifest.versions] == [(1, "anchor")] + [(v, "delta") for v in range(2, 6)]
    reader = Subscriber(tmp_path)
    assert reader.sync() == 5 and states_equal(reader.state, states[5])


def test_server_stopped_and_restarted_mid_run(own_rclone_s3):
    rclone_s3 = own_rclone_s3
    states = trajectory(8)
    options = dict(rclone_s3.storage_options(), retry=RetryPolicy(attempts=2, first_delay=0.1, max_delay=0.2))
    url = "s3://bucket/run"
    config = PublisherConfig(anchor_every=100, retry_delay=0.2, max_retry_delay=0.5)
    with Publisher(url, config, **options) as pub:
        for s in states[1:4]:
            pub.publish(s)
            assert pub.flush(timeout=60)
        rclone_s3.stop()
        for s in states[4:8]:
            pub.publish(s)
            time.sleep(0.2)
        assert not pub.flush(timeout=1.0)  # cannot commit while the server is down
        rclone_s3.start()
        assert pub.flush(timeout=60)
    reader = Subscriber(url, **options)
    assert reader.sync() == pub.last.version and states_equal(reader.state, states[7])


def _run_ranks(bucket, mode: str, phases: str, environ: dict[int, dict[str, str]] | None = None) -> list[str]:
    """Run `tests._rank_child` as 2 gloo ranks to the end (`environ`: variables set for a rank); their outputs, each
    checked to have exited 0."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests._rank_child", str(bucket), str(rank), "2", str(port), mode,
                               phases], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, **(environ or {}).get(rank, {})})
             for rank in range(2)]
    outs = [p.communicate(timeout=150)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def _ok(results) -> None:
    for code, out in results:
        assert code == 0, out


@pytest.mark.parametrize("mode", ["names", "split"])
def test_two_ranks_under_torch_distributed(tmp_path, mode):
    """Two gloo ranks publish disjoint tensors (`names`) or each its share of every tensor, all held by
    both (`split`); the second publisher run resumes with deltas; readers rebuild every state. Rank 0 alone signs, with
    the key kept for the bucket: rank 1 never reads a key (the one it is given is no key at all)."""
    bucket = tmp_path / "bucket"
    _ok(_run_ranks(bucket, mode, "both", {1: {"DELTA_SIGNING_KEY": "not a key"}}))
    manifest = read_manifest(Bucket.open(bucket))
    key = trainer_key(Bucket.open(bucket).url).public
    assert {v.signer for v in manifest.versions} == {key.text} and all(v.signature for v in manifest.versions)
    assert manifest.shards is not None and len(manifest.shards) == 2
    assert all(len(v.delta) == 2 for v in manifest.versions[1:]) and len(manifest.versions[0].anchor) == 2
    if mode == "split":  # every tensor cut in two, one piece per rank, rows 0..n/2 on rank 0
        assert sorted(manifest.pieces) == sorted(trajectory(0)[0])
        assert all([p[1:] for p in s.pieces] == [(0, s.shape[0] // 2), (s.shape[0] // 2, s.shape[0])]
                   for s in manifest.pieces.values())
    else:
        assert manifest.pieces is None
    states = trajectory(6)
    for v in manifest.versions:  # the state hash does not depend on how the ranks cut the state
        assert v.state_hash == state_digest(states[v.version]).hexdigest
    for version in (3, 6):
        reader = Subscriber(bucket)
        assert reader.sync(version) == version and states_equal(reader.state, states[version])
        assert reader.digest.hexdigest == state_digest(reader.state).hexdigest


def test_resume_one_rank_as_two_and_two_as_one(tmp_path):
    """A run resumed with another number of ranks publishes an anchor that starts a new chain; readers
    at the old chain's versions and new readers all reach the new versions bit for bit."""
    states = trajectory(6)
    config = PublisherConfig(anchor_every=100)
    one_then_two = tmp_path / "one-then-two"
    with Publisher(one_then_two, config) as pub:
        for s in states[1:4]:
            pub.publish(s)
            assert pub.flush(timeout=60)
    _ok(_run_ranks(one_then_two, "split", "second"))
    two_then_one = tmp_path / "two-then-one"
    _ok(_run_ranks(two_then_one, "split", "first"))
    reader = Subscriber(two_then_one)
    assert reader.sync() == 3 and states_equal(reader.state, states[3])
    with Publisher(two_then_one, config) as pub:
        assert pub.last.version == 3
        for s in states[4:]:
            pub.publish(s)
            assert pub.flush(timeout=60)
    for bucket, pieces in ((one_then_two, True), (two_then_one, False)):
        manifest = read_manifest(Bucket.open(bucket))
        assert [v.version for v in manifest.versions] == [4, 5, 6]
        assert manifest.get(4).kind == "anchor" and not manifest.get(4).delta and manifest.get(5).delta
        assert bool(manifest.pieces) is pieces and (manifest.shards is not None) is pieces
        assert all(version_of_path(f.path) in (4, 5, 6) for f in Bucket.open(bucket).list("versions/"))
        fresh = Subscriber(bucket)
        assert fresh.sync() == 6 and states_equal(fresh.state, states[6])
        behind = Subscriber(bucket, {k: v.clone() for k, v in states[3].items()}, version=3)
        assert behind.sync() == 6 and states_equal(behind.state, states[6])
    assert reader.sync() == 6 and states_equal(reader.state, states[6])  # followed the 2-rank chain, then the new one


def test_a_rank_killed_mid_publish_leaves_the_previous_version(tmp_path):
    """Rank 1 dies while version 3 is being written: rank 0 stops with PublishError and the bucket's latest
    version stays 2 or, when rank 1 died after its share had landed, version 3 is committed whole, with both
    ranks' files. Never a torn version: readers rebuild the latest exactly."""
    bucket = tmp_path / "bucket"
    results = _run_ranks(bucket, "split", "kill")
    assert results[0][0] == 0, results[0][1]
    assert results[1][0] == -9, results[1][1]
    manifest = read_manifest(Bucket.open(bucket))
    if "stopped as expected" in results[0][1]:
        assert manifest.latest.version == 2
    else:
        assert "committed version 3 with rank 1's files" in results[0][1], results[0][1]
        assert manifest.latest.version == 3 and sorted(f.rank for f in manifest.latest.delta) == [0, 1]
    states = trajectory(6)
    reader = Subscriber(bucket)
    latest = manifest.latest.version
    assert reader.sync() == latest and states_equal(reader.state, states[latest])


def test_publisher_killed_at_random_points(tmp_path):
    """SIGKILL the publishing process over and over: readers only ever hold whole, published states,
    and each new publisher resumes cleanly from the bucket."""
    from ._publish_child import N, STATES

    states = trajectory(STATES, n=N)
    known = {state_digest(s).hexdigest: i for i, s in enumerate(states)}
    bucket = Bucket.open(tmp_path / "bucket")
    seen: list[tuple[int, str]] = []
    reader = Subscriber(bucket, config=SubscriberConfig(poll_interval=0.02, max_backoff=0.2),
                        on_update=lambda u: seen.append((u.version, reader.digest.hexdigest)))
    reader.start()
    rng = random.Random(7)
    first = 1
    progress = []

    def child(last: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tests._publish_child", str(tmp_path / "bucket"), str(first),
                                 str(last)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    for _ in range(6):
        proc = child(STATES)
        assert proc.stdout.readline(), proc.communicate()[1]  # one version committed by this run
        time.sleep(rng.uniform(0.0, 0.3))  # then a random point: encoding, uploading, committing, collecting
        proc.kill()
        proc.wait(timeout=30)
        manifest = read_manifest(bucket)  # parses: versions consecutive, files listed
        if manifest is not None:
            first = known[manifest.latest.state_hash] + 1  # the trainer restarts after the published step
            progress.append(manifest.latest.version)
    assert len(set(progress)) >= 3, progress  # the kills fell between versions, not only before the first
    proc = child(STATES)
    _, err = proc.communicate(timeout=120)  # the last run publishes the remaining states to the end
    assert proc.returncode == 0, err
    manifest = read_manifest(bucket)
    assert manifest.latest.state_hash == state_digest(states[STATES]).hexdigest
    assert reader.wait_for(manifest.latest.version, timeout=60), reader.status()
    reader.close()
    assert states_equal(reader.state, states[STATES])
    assert [v for v, _ in seen] == sorted({v for v, _ in seen})  # versions only go up
    assert all(h in known for _, h in seen)  # every state a reader held was one the trainer published
    # Crashed attempts left no garbage behind the newest version.
    leftovers = {f.path for f in bucket.list("versions/")} - manifest.referenced()
    assert all(version_of_path(p) > manifest.latest.version for p in leftovers), leftovers


def test_workers_setting_is_checked_and_used(tmp_path):
    with pytest.raises(ValueError, match=r"workers must be >= 1 \(or None: one per core\), got 0"):
        PublisherConfig(workers=0)
    with pytest.raises(ValueError, match=r"workers must be >= 1 \(or None: one per core\), got 0"):
        SubscriberConfig(workers=0)
    states = trajectory(3)
    with Publisher(str(tmp_path), PublisherConfig(workers=1)) as pub:
        for s in states:
            pub.publish(s)
            assert pub.flush(timeout=60)
    reader = Subscriber(str(tmp_path), config=SubscriberConfig(workers=1))
    assert reader.sync() == len(states) and states_equal(reader.state, states[-1])


def test_a_minimum_interval_between_commits_coalesces_the_steps_in_between(tmp_path) -> None:
    states = trajectory(6, n=2000)
    with Publisher(str(tmp_path), PublisherConfig(min_interval=1.5)) as pub:
        pub.publish(states[1])
        assert pub.flush(30)  # a flush does not wait for the interval
        for s in states[2:5]:  # three steps within the interval: one version, of the last
            pub.publish(s)
        deadline = time.monotonic() + 30
        while (pub.last.version if pub.last else 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pub.last.version == 2
        with Subscriber(str(tmp_path)) as coalesced:
            assert coalesced.sync() == 2 and states_equal(coalesced.state, states[4])
        pub.publish(states[5])
        pub.publish(states[6])
        assert pub.flush(30) and pub.last.version == 3
    sub = Subscriber(str(tmp_path))
    assert sub.sync() == 3 and states_equal(sub.state, states[6])
    with pytest.raises(ValueError, match="min_interval must be >= 0"):
        PublisherConfig(min_interval=-1)
