"""A session's loaded parts: nothing before `load`; after it the model, resumed from the bucket bit for bit,
with the publisher wrapped as the session was told (tiny model, local bucket, no servers, no training)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import TrainerControl

from delta import PublishedVersion, read_manifest
import delta
from tests._engines import step
from tests._trainer_stack import tiny_model
from trainer_space import TrainerConfig, build_session

NO_ROLLOUT = "http://127.0.0.1:1"  # nothing here plays games: no run starts


class Counting:
    """A publisher wrapper that counts the publishes it passes on (as a benchmark's schedule would)."""

    def __init__(self, publisher: delta.Publisher) -> None:
        self.publisher, self.calls = publisher, 0

    @property
    def last(self) -> PublishedVersion | None:
        return self.publisher.last

    def publish(self, state: Mapping[str, torch.Tensor]) -> None:
        self.calls += 1
        self.publisher.publish(state)

    @property
    def state_version(self) -> int:
        return self.publisher.state_version

    def flush(self, timeout: float | None = None) -> bool:
        return self.publisher.flush(timeout)


def test_status_reads_not_loaded_until_load_then_the_loaded_model(tmp_path) -> None:
    session = build_session(TrainerConfig(str(tmp_path / "bucket"), NO_ROLLOUT, tiny_model(str(tmp_path / "m"))))
    before = session.status().model_dump()
    assert session.parts is None and session.payloads is None and session.recent_games() == []
    assert [before[k] for k in ("version", "trainer_version", "state_hash", "resumed_from", "staleness",
                                "rollout_error", "rollout_failing")] == [0, None, None, None, None, None, 0]
    parts = session.load()
    try:
        assert session.load() is parts is session.parts  # loaded once
        assert session.payloads is parts.payloads is not None
        after = session.status().model_dump()
        assert after.keys() == before.keys()
        assert [after[k] for k in ("version", "trainer_version", "state_hash", "resumed_from", "resumed_hash",
                                   "rollout_failing")] == [0, 0, None, None, None, 0]
        assert after["staleness"] == {"games": 0, "replayed": 0, "dropped": 0, "max_seen": 0, "refused": 0}
        assert {t.dtype for t in parts.master.values()} == {torch.float32}  # fp32 master weights
        assert {t.dtype for t in parts.published.values()} == {torch.bfloat16}  # the checkpoint's dtype
    finally:
        session.close()


def test_load_resumes_from_the_bucket_and_the_callback_publishes_through_the_wrapper(tmp_path) -> None:
    model, bucket = tiny_model(str(tmp_path / "m")), str(tmp_path / "bucket")
    name = "model.layers.1.mlp.up_proj.weight"
    stored = step(delta.load_state(model), [name], seed=1, lr=1e-2)
    with delta.Publisher(bucket) as publisher:
        publisher.publish(stored)
    wrappers: list[Counting] = []

    def wrap(publisher: delta.Publisher) -> Counting:
        wrappers.append(Counting(publisher))
        return wrappers[-1]

    session = build_session(TrainerConfig(bucket, NO_ROLLOUT, model), wrap_publisher=wrap)
    parts = session.load()
    try:
        status = session.status().model_dump()
        assert (status["resumed_from"], status["version"], status["trainer_version"]) == (1, 1, 1)
        assert status["resumed_hash"] == status["state_hash"] == read_manifest(delta.Bucket.open(bucket)).latest.state_hash
        assert torch.equal(parts.published[name].view(torch.int16), stored[name].view(torch.int16))
        assert torch.equal(parts.master[name], stored[name].float())  # the master weights resumed too
        [wrapper] = wrappers
        assert parts.callback.publisher is wrapper and wrapper.publisher is parts.publisher
        with torch.no_grad():
            parts.master[name].add_(0.1)  # an optimizer step
        parts.callback.on_step_end(None, None, TrainerControl())
        assert wrapper.calls == 1 and parts.publisher.flush(30)
        assert (session.version, session.status().trainer_version) == (2, 2)
    finally:
        session.close()


def test_with_publishing_off_nothing_is_wrapped_and_versions_count_steps(tmp_path) -> None:
    config = TrainerConfig(str(tmp_path / "bucket"), NO_ROLLOUT, tiny_model(str(tmp_path / "m")), publish=False)

    def wrap(publisher: delta.Publisher) -> Counting:
        raise AssertionError("nothing to wrap with publishing off")

    session = build_session(config, wrap_publisher=wrap)
    parts = session.load()
    assert parts.publisher is None and parts.payloads is None and parts.callback.publisher is None
    parts.callback.on_step_end(None, None, TrainerControl())
    assert (session.version, session.status().state_hash) == (1, None)
    session.close()
