"""Retention: the newest K anchors and what hangs off them stay; everything else goes."""

from __future__ import annotations

from delta import Bucket
from delta import Publisher, PublisherConfig, Subscriber, read_manifest
from delta.bucket.retention import gc, retain

from ._states import states_equal
from ._trainer import trajectory


def test_gc_keeps_newest_anchors_and_removes_unreferenced_files(tmp_path):
    states = trajectory(9, n=20_000)
    bucket = Bucket.open(tmp_path)
    with Publisher(bucket, PublisherConfig(anchor_every=3, keep_anchors=10)) as pub:
        for s in states[1:]:
            pub.publish(s)
            pub.flush()
    manifest = read_manifest(bucket)
    assert [v.version for v in manifest.anchors()] == [1, 4, 7]
    assert [v.version for v in retain(manifest, 2).versions] == [4, 5, 6, 7, 8, 9]
    bucket.write("versions/00000002-deadbeef/delta-r00000.safetensors", b"torn attempt")
    bucket.write("versions/00000010-deadbeef/delta-r00000.safetensors", b"publish in progress")

    report = gc(bucket, manifest, keep_anchors=1)
    assert report.dropped_versions == (1, 2, 3, 4, 5, 6)
    kept = read_manifest(bucket)
    assert kept == report.manifest and [v.version for v in kept.versions] == [7, 8, 9]
    left = {f.path for f in bucket.list("versions/")}
    assert left == kept.referenced() | {"versions/00000010-deadbeef/delta-r00000.safetensors"}
    assert len(bucket.list("manifests/")) <= 3

    sub = Subscriber(bucket)
    assert sub.sync() == 9 and states_equal(sub.state, states[-1])


def test_old_manifests_are_deleted_a_batch_at_a_time_not_one_per_commit(tmp_path) -> None:
    from delta.bucket.retention import KEEP_OLD_MANIFESTS, OLD_MANIFESTS_BATCH

    states = trajectory(OLD_MANIFESTS_BATCH + 6, n=200)
    bucket = Bucket.open(tmp_path)
    counts = []
    with Publisher(bucket, PublisherConfig(anchor_every=1000)) as pub:
        for s in states[1:]:
            pub.publish(s)
            pub.flush()
            counts.append(len(bucket.list("manifests/")))
    most = KEEP_OLD_MANIFESTS + OLD_MANIFESTS_BATCH
    assert max(counts) == most and counts.index(most) == most - 1  # they gather up to the batch...
    assert counts[most] == KEEP_OLD_MANIFESTS + 1  # ...and go in one delete
    assert Subscriber(bucket).sync() == len(states) - 1
