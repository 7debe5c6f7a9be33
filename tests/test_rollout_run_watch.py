"""A server that plays no games for the fleet still follows the state the run's settings name (rollout_space/run_watch.py)."""

from __future__ import annotations

import time

import pytest

import delta
from delta import SubscriberConfig
from rollout_space.engines import EngineConfig, open_engine
from rollout_space.errors import LoraRefusedError
from rollout_space.follower import Follower
from rollout_space.run_watch import RunWatch
from tests._engines import build_model
from tests._lora import peft_model, settings
from tests.test_wire_fleet import run_settings
from trainer_space.lora import adapter_tensors
from wire.fleet import RUN_PATH
from fleet.bucket import FleetBucket

FAST = SubscriberConfig(poll_interval=0.05, max_backoff=0.2)


def test_a_server_without_a_producer_follows_an_adapter_run_and_shows_a_refusal(tmp_path) -> None:
    model = build_model(str(tmp_path / "model"), seed=1)
    bucket = str(tmp_path / "bucket")
    fleet = FleetBucket(bucket)
    lora = settings(model)
    adapter = {n: t.clone() for n, t in adapter_tensors(peft_model(model, lora)).items()}
    with delta.Publisher(bucket) as publisher:
        publisher.publish(adapter)
        publisher.flush()
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        watch = RunWatch(fleet, follower.adopt, interval=0.05)
        watch.poll()  # no run yet: full weights
        assert follower.lora is None
        fleet.write_run(run_settings().model_copy(update={"lora": lora}))
        watch.poll()
        assert follower.lora == lora and follower.sync() == 1
        assert delta.state_digest(engine.state).hexdigest == delta.state_digest(adapter).hexdigest
        other = settings(model, base_hash="sum128:" + "0" * 32)
        fleet.write_run(run_settings().model_copy(update={"lora": other}))
        with pytest.raises(LoraRefusedError, match="this server's model hashes to"):
            watch.poll()
        watch.start()
        try:
            deadline = time.monotonic() + 10
            while watch.last_error is None:
                assert time.monotonic() < deadline, "the watch never read the run"
                time.sleep(0.02)
            assert "start it with the run's base model" in watch.last_error
            assert follower.status()["last_error"] == watch.last_error  # what the page shows as the last error
            assert follower.lora == lora and engine.version == 1  # still serving what it served
            fleet.write_run(run_settings().model_copy(update={"lora": lora}))  # the run is the server's again
            deadline = time.monotonic() + 10
            while watch.last_error is not None:
                assert time.monotonic() < deadline, "the watch never read the run again"
                time.sleep(0.02)
            assert follower.status()["last_error"] is None
            fleet.bucket.delete([RUN_PATH])  # a run's settings deleted (by anyone who writes the bucket)
            time.sleep(0.3)
            assert follower.lora == lora and engine.version == 1 and watch.last_error is None  # nothing to follow
        finally:
            watch.close()
            follower.close()
