"""Subscriber: following, catching up, and bad or missing files in the bucket."""

from __future__ import annotations

import time

import pytest

from delta import Bucket
from delta import NoPathError, Publisher, PublisherConfig, Subscriber, SubscriberConfig, read_manifest, state_digest
from delta.storage import LocalStorage

from ._capped import run_capped
from ._signed import signed
from ._states import clone, states_equal
from ._trainer import trajectory

FAST = SubscriberConfig(poll_interval=0.02, max_backoff=0.2)


def publish_all(bucket, states, config=PublisherConfig(), **options):
    with Publisher(bucket, config, **options) as pub:
        for s in states:
            pub.publish(s)
            assert pub.flush(timeout=60)
    return pub


def test_follows_in_background_and_reports_changed_tensors(tmp_path):
    states = trajectory(6)
    updates = []
    reader = Subscriber(str(tmp_path), config=FAST, on_update=updates.append)
    reader.start()
    with Publisher(str(tmp_path)) as pub:
        for i, s in enumerate(states[1:], start=1):
            pub.publish(s)
            pub.flush()
            assert reader.wait_for(i, timeout=30)
            with reader.lock:
                assert states_equal(reader.state, s)
    reader.close()
    assert [u.version for u in updates] == [1, 2, 3, 4, 5, 6]
    assert updates[0].changed == tuple(sorted(states[0])) and updates[0].stats.via == "anchor"
    assert set(updates[1].changed) <= set(states[0]) and updates[1].stats.via == "delta"
    status = reader.status()
    assert (status.version, status.latest, status.lag, status.last_error) == (6, 6, 0, None)
    assert all(h.bytes_fetched > 0 and h.apply_pause_s >= 0 for h in status.history)


class _CountedLooks(LocalStorage):
    """A local bucket that counts its listings (each look of a reader is one)."""

    def __init__(self, url):
        super().__init__(url)
        self.listings = 0

    def _list(self, folder):
        self.listings += 1
        return super()._list(folder)


@pytest.mark.parametrize("told", [False, True], ids=["not told", "told"])
def test_a_reader_told_the_publishers_interval_looks_about_once_a_version(tmp_path, told):
    states = trajectory(4)
    storage = _CountedLooks(str(tmp_path))
    config = SubscriberConfig(poll_interval=0.05, idle_poll_max=0.05, version_interval=1.5 if told else None)
    with Publisher(str(tmp_path), PublisherConfig(min_interval=1.5)) as pub, Subscriber(storage, config=config) as reader:
        reader.start()
        for version, state in enumerate(states[1:], start=1):  # each commit 1.5 s after the one before, at the soonest
            pub.publish(state)
            assert reader.wait_for(version, timeout=30)
            with reader.lock:
                assert states_equal(reader.state, state)
    if told:
        assert storage.listings <= 2 * len(states), storage.listings
    else:  # a look every 50 ms while it waits: the same run costs many more
        assert storage.listings > 5 * len(states), storage.listings


def test_caller_state_is_updated_in_place(tmp_path):
    states = trajectory(3)
    publish_all(str(tmp_path), states[1:3])
    mine = clone(states[2])
    tensors = dict(mine)
    reader = Subscriber(str(tmp_path), mine, version=2)
    publish_all(str(tmp_path), states[3:])
    assert reader.sync() == 3 and states_equal(mine, states[3])
    assert all(tensors[k] is mine[k] for k in mine) and reader.status().history[0].via == "delta"
    # A state that is not the version it claims to be: caught by the hash, fixed through an anchor.
    wrong = Subscriber(str(tmp_path), clone(states[1]), version=2)
    assert wrong.sync() == 3 and states_equal(wrong.state, states[3])
    assert wrong.status().history[0].via == "anchor"


def test_late_reader_catches_up_through_the_newest_anchor(tmp_path):
    states = trajectory(25)
    publish_all(str(tmp_path), states[1:], PublisherConfig(anchor_every=10, keep_anchors=3))
    reader = Subscriber(str(tmp_path))
    assert reader.sync() == 25 and states_equal(reader.state, states[25])
    assert [(h.version, h.via) for h in reader.status().history] == [(21, "anchor")] + [(v, "delta") for v in range(22, 26)]
    # A reader down for many versions: one old anchor in hand, deltas are cheaper than the newest anchor.
    back = Subscriber(str(tmp_path), clone(states[12]), version=12)
    assert back.sync(15) == 15 and [h.via for h in back.status().history] == ["delta"] * 3


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_bad_files_are_detected_and_bypassed_through_an_anchor(tmp_path, damage):
    states = trajectory(8)
    bucket = Bucket.open(tmp_path)
    publish_all(bucket, states[1:], PublisherConfig(anchor_every=5))  # anchors at 1 and 6
    manifest = read_manifest(bucket)
    bad = manifest.get(5).delta[0]
    path = tmp_path / bad.path
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        path.unlink()

    reader = Subscriber(bucket, clone(states[4]), version=4)
    before = clone(reader.state)
    with pytest.raises(NoPathError):
        reader.sync(5)  # the only route to 5 crosses the bad file: nothing applied, version unchanged
    assert reader.version == 4 and states_equal(reader.state, before)
    assert reader.status().failures >= 1 and "versions/00000005" in reader.status().last_error
    assert reader.sync() == 8 and states_equal(reader.state, states[8])
    assert [(h.version, h.via) for h in reader.status().history] == [(6, "anchor"), (7, "delta"), (8, "delta")]


@pytest.mark.parametrize("path", ["../../outside.safetensors", "/etc/passwd", "versions/a\x1bb", "versions//x"])
def test_a_path_the_bucket_refuses_is_a_bad_file_routed_around_like_a_missing_one(tmp_path, path):
    from dataclasses import replace

    from delta.bucket.manifest import write_manifest

    states = trajectory(6)
    bucket = Bucket.open(tmp_path)
    publish_all(bucket, states[1:], PublisherConfig(anchor_every=5))  # anchors at 1 and 6
    manifest = read_manifest(bucket)
    entry = manifest.get(6)
    forged = replace(entry, delta=(replace(entry.delta[0], path=path),))
    write_manifest(bucket, signed(bucket, replace(manifest, versions=tuple(forged if v.version == 6 else v
                                                                          for v in manifest.versions))))
    reader = Subscriber(bucket, clone(states[5]), version=5)  # the cheapest route to 6 is its delta: a bad path
    assert reader.sync() == 6 and states_equal(reader.state, states[6])
    assert [(h.version, h.via) for h in reader.status().history] == [(6, "anchor")]
    assert reader.status().failures == 1 and "invalid bucket path" in reader.status().last_error


def test_sixteen_readers_follow_fifty_versions_on_s3(rclone_s3):
    states = trajectory(50, n=20_000)
    options = rclone_s3.storage_options()
    url = f"s3://{rclone_s3.bucket}/run"
    readers = [Subscriber(url, config=SubscriberConfig(poll_interval=0.1, max_backoff=0.5), **options)
               for _ in range(16)]
    for r in readers:
        r.start()
    with Publisher(url, PublisherConfig(anchor_every=20), **options) as pub:
        for s in states[1:]:
            pub.publish(s)
            assert pub.flush(timeout=60)
    deadline = time.monotonic() + 120
    for r in readers:
        assert r.wait_for(50, timeout=max(1, deadline - time.monotonic())), r.status()
        r.close()
        assert states_equal(r.state, states[50])
    assert all(r.digest.hexdigest == state_digest(states[50]).hexdigest for r in readers)


def test_an_unexpected_failure_is_reported_and_retried_not_fatal(tmp_path, monkeypatch):
    import delta.bucket.reader as reader_module

    states = trajectory(3)
    real, calls = reader_module.decode, []

    def fails_twice(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise MemoryError("no room to decode")
        return real(*args, **kwargs)

    with Publisher(str(tmp_path)) as pub:
        for s in states[:2]:
            pub.publish(s)
            assert pub.flush(timeout=60)
        reader = Subscriber(str(tmp_path), config=FAST)
        assert reader.sync() == 2
        monkeypatch.setattr(reader_module, "decode", fails_twice)
        reader.start()
        pub.publish(states[2])
        assert pub.flush(timeout=60)
    try:
        assert reader.wait_for(3, timeout=30), reader.status()
        status = reader.status()
        assert status.failures >= 2 and status.last_error == "MemoryError: no room to decode"
        with reader.lock:
            assert states_equal(reader.state, states[2])
    finally:
        reader.close()


# A bucket whose reads are counted (a real local bucket; `_read` is the one primitive every read goes through).
_COUNTING = '''
from delta.storage import LocalStorage
class Counting(LocalStorage):
    reads = {}
    def _read(self, path, max_bytes, listed):
        self.reads[path] = self.reads.get(path, 0) + 1
        return super()._read(path, max_bytes, listed)
'''


def test_a_2_gb_newest_manifest_is_refused_unread_and_the_one_before_followed(tmp_path):
    """Under a memory cap that reading it whole breaks: `sync` falls back to the previous manifest, raises nothing,
    and the refused one is not read again until its listing changes."""
    setup = (_COUNTING + "import sys\nfrom delta import Publisher, Subscriber\nfrom tests._trainer import trajectory\n"
             "from tests._capped import sparse\nfrom pathlib import Path\n"
             f"root = Path({str(tmp_path)!r})\nstates = trajectory(3, n=2000)\n"
             "with Publisher(str(root)) as pub:\n    for s in states[1:]:\n        pub.publish(s)\n"
             "        assert pub.flush(timeout=60)\n"
             "huge = sparse(root / 'manifests' / '9999999999.json', head=b'{')\n"
             "reader = Subscriber(Counting(root))")
    body = ("print('held', reader.sync(), reader.sync())\n"
            "print('reads', reader.storage.reads.get('manifests/9999999999.json', 0))\n"
            "huge.write_bytes(b'not json')  # its listing changes: read once more, refused as not parsing\n"
            "print('again', reader.sync(), reader.storage.reads['manifests/9999999999.json'])\n"
            "print('status', reader.status().failures, reader.status().manifests_refused)")
    done = run_capped(setup, body)
    assert "held 3 3\nreads 0\nagain 3 1\nstatus 0 1\n" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "more than the 268,435,456 a manifest may hold" in done.stderr  # warned about, in one line


def test_a_data_file_swapped_for_a_2_gb_one_is_a_bad_file_not_read_past_its_size(tmp_path):
    setup = ("from delta import Publisher, PublisherConfig, Subscriber, read_manifest, state_digest\n"
             "from delta.storage import open_storage\nfrom tests._trainer import trajectory\n"
             "from tests._capped import sparse\nfrom pathlib import Path\n"
             f"root = Path({str(tmp_path)!r})\nstates = trajectory(7, n=2000)\n"
             "with Publisher(str(root), PublisherConfig(anchor_every=5)) as pub:\n    for s in states[1:]:\n"
             "        pub.publish(s)\n        assert pub.flush(timeout=60)\n"
             "manifest = read_manifest(root)\n"
             "sparse(root / manifest.get(5).delta[0].path)  # the route from 4: around it, through the anchor of 6\n"
             "reader = Subscriber(str(root), {k: v.clone() for k, v in states[4].items()}, version=4)")
    body = ("print('held', reader.sync())\nprint('via', [h.via for h in reader.status().history])\n"
            "print('same', reader.digest.hexdigest == state_digest(states[7]).hexdigest)\n"
            "print('error', reader.status().last_error)")
    done = run_capped(setup, body)
    assert "held 7\nvia ['anchor', 'delta']\nsame True\n" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "wrong size (expected " in done.stdout and ", got 2147483648)" in done.stdout  # the listed size, unread
