"""PublishCallback and PayloadLog on a real local bucket: what each step publishes, and what it cost."""

from __future__ import annotations

import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

import delta
from delta import read_manifest
from tests._trainer import trajectory
from trainer_space.payload import raw_bytes
from trainer_space.publishing import PayloadLog, PublishCallback
from wire.trainer import Anchor, TrainerHistory


def test_each_step_end_publishes_the_next_version_and_the_payload_log_measures_it(tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    states = trajectory(3, n=20_000)
    live = {k: v.clone() for k, v in states[0].items()}  # the "model": updated in place, like an optimizer does
    trainers = delta.Bucket.open(bucket, writer=True)  # the trainer's: the publisher and the payload log share it
    publisher = delta.Publisher(trainers, delta.PublisherConfig(anchor_every=50))
    dense = sum(t.numel() * t.element_size() for t in live.values())
    log = PayloadLog(trainers, dense).start()
    callback = PublishCallback(publisher, live, version=0)
    args, control = TrainingArguments(str(tmp_path / "out"), report_to="none"), TrainerControl()
    for new in states[1:]:
        for k, t in live.items():
            t.copy_(new[k])
        callback.on_step_end(args, TrainerState(), control)
        assert callback.version == callback.steps  # committed, or the next while it uploads: the same number
        assert publisher.flush(30)  # a real step lasts longer than publishing: no coalescing here
    assert callback.version == 3
    log.poll()
    log.close()
    publisher.close()

    manifest = read_manifest(delta.Bucket.open(bucket))
    assert [v.version for v in manifest.versions] == [1, 2, 3]
    assert manifest.latest.state_hash == delta.state_digest(states[3]).hexdigest
    assert [p.version for p in log.records] == [2, 3]  # version 1 is the first: an anchor, no delta
    for p, old, new in zip(log.records, states[1:], states[2:]):
        raw = delta.diff(old, new, codec="raw", version=p.version, base_version=p.version - 1)
        header, blobs = delta.read_delta(raw)
        assert p.raw_bytes == raw_bytes(header) == sum(b.numel() * b.element_size() for b in blobs.values())
        assert p.changed == header.changed > 0 and p.total == sum(t.numel() for t in new.values())
        assert p.delta_bytes == manifest.get(p.version).delta_bytes < p.raw_bytes and p.dense_bytes == dense
    assert log.latest_header is not None and log.latest_header.version == 3


def test_versions_follow_the_buckets_numbering_when_publishing_coalesces(tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    states = trajectory(6, n=20_000)
    live = {k: v.clone() for k, v in states[0].items()}
    with delta.Publisher(bucket) as publisher:
        callback = PublishCallback(publisher, live, version=0)
        for new in states[1:]:  # back to back: later snapshots replace a waiting one
            for k, t in live.items():
                t.copy_(new[k])
            callback.on_step_end(None, None, TrainerControl())
        assert publisher.flush(30)
        latest = read_manifest(delta.Bucket.open(bucket)).latest
        assert callback.steps == 6 and callback.version == latest.version <= 6
        assert latest.state_hash == delta.state_digest(states[6]).hexdigest


def test_publishing_off_counts_versions_without_writing(tmp_path) -> None:
    live = {"w": torch.zeros(4, dtype=torch.bfloat16)}
    callback = PublishCallback(None, live, version=7)
    callback.on_step_end(None, None, TrainerControl())
    assert callback.version == 8
    assert not (tmp_path / "bucket").exists()


def test_a_restarted_payload_log_goes_on_from_the_history_and_draws_the_newest_delta(tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    states = trajectory(3, n=20_000)
    with delta.Publisher(bucket, delta.PublisherConfig(anchor_every=50)) as publisher:
        for state in states[1:]:  # versions 1 (the first: an anchor), 2 and 3
            publisher.publish(state)
            assert publisher.flush(30)

    def started(earlier: TrainerHistory | None) -> PayloadLog:
        log = PayloadLog(delta.Bucket.open(bucket, writer=True), 1, earlier=earlier).start()
        log.close()
        return log

    fresh = started(None)  # no history: the newest version is measured, older ones are left
    assert [p.version for p in fresh.records] == [3] and fresh.latest_header.version == 3
    v2 = fresh.records[0].model_copy(update={"version": 2})
    anchor = Anchor(version=1, bytes=10, at=1.0)
    missed = started(TrainerHistory(steps=[], payloads=[v2], anchors=[anchor]))  # killed before measuring 3
    assert [p.version for p in missed.records] == [2, 3] and [a.version for a in missed.anchors] == [1]
    whole = started(TrainerHistory(steps=[], payloads=missed.records, anchors=[anchor]))  # all measured before
    assert whole.records == missed.records  # nothing twice
    assert whole.latest_header is not None and whole.latest_header.version == 3  # the heatmap still has its delta
