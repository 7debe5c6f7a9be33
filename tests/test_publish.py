"""Publisher: versions committed in order, coalescing, resume from the bucket, retries, several ranks."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from delta.hashing import state_digest
from delta.manifest import read_manifest, version_of_path
from delta.publish import Publisher, PublisherConfig
from delta.storage import RetryPolicy, open_storage
from delta.subscribe import Subscriber, SubscriberConfig

from ._states import states_equal
from ._trainer import trajectory
from ._env_server import free_port

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
    manifest = read_manifest(open_storage(tmp_path))
    assert [v.version for v in manifest.anchors()] == [6, 11]  # 1 was dropped by retention
    assert [v.version for v in manifest.versions] == list(range(6, 13))
    assert all(v.delta for v in manifest.versions)  # anchors carry a delta too: live readers never need them
    assert [h.via for h in reader.status().history] == ["anchor"] + ["delta"] * 11


def test_coalesces_when_uploads_fall_behind(tmp_path):
    states = trajectory(30)
    with Publisher(str(tmp_path)) as pub:
        start = time.perf_counter()
        for s in states[1:]:
            pub.publish(s)
        blocked = time.perf_counter() - start
        assert pub.flush(timeout=60)
    latest = pub.last.version
    assert latest < 30  # the background could not keep up with 30 back-to-back publishes
    assert blocked < 5.0
    reader = Subscriber(tmp_path)
    assert reader.sync() == latest and states_equal(reader.state, states[-1])  # the newest state always lands


def test_resume_continues_numbering_and_checks_the_state(tmp_path):
    states = trajectory(6)
    with Publisher(str(tmp_path)) as pub:
        for s in states[1:4]:
            pub.publish(s)
            pub.flush()
    # The caller's base_state is not the bucket's latest: it is refused and the base pulled from the bucket.
    with Publisher(str(tmp_path), base_state=states[1]) as pub:
        assert pub.last.version == 3 and pub.last.state_hash == read_manifest(open_storage(tmp_path)).latest.state_hash
        pub.publish(states[4])
        pub.flush()
    with Publisher(str(tmp_path), base_state=states[4]) as pub:
        pub.publish(states[5])
    manifest = read_manifest(open_storage(tmp_path))
    assert [(v.version, v.kind) for v in manifest.versions] == [(1, "anchor")] + [(v, "delta") for v in range(2, 6)]
    reader = Subscriber(tmp_path)
    assert reader.sync() == 5 and states_equal(reader.state, states[5])


def test_server_stopped_and_restarted_mid_run(rclone_s3):
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


def test_two_ranks_under_torch_distributed(tmp_path):
    bucket = tmp_path / "bucket"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests._rank_child", str(bucket), str(rank), "2", str(port)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=150)
        assert p.returncode == 0, out
    manifest = read_manifest(open_storage(bucket))
    assert manifest.shards is not None and len(manifest.shards) == 2
    assert all(len(v.delta) == 2 for v in manifest.versions[1:]) and len(manifest.versions[0].anchor) == 2
    states = trajectory(6)
    for version in (3, 6):
        reader = Subscriber(bucket)
        assert reader.sync(version) == version and states_equal(reader.state, states[version])


def test_publisher_killed_at_random_points(tmp_path):
    """SIGKILL the publishing process over and over: readers only ever hold whole, published states,
    and each new publisher resumes cleanly from the bucket."""
    from ._publish_child import N, STATES

    states = trajectory(STATES, n=N)
    known = {state_digest(s).hexdigest: i for i, s in enumerate(states)}
    bucket = open_storage(tmp_path / "bucket")
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
