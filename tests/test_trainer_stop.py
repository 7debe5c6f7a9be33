"""A trainer told to stop while its step hangs on the rollout (a CPU step takes minutes) does not wait
for that step: it commits its last finished version and returns within its budget, so the launcher's
kill after `settings.STOP_TIMEOUT_S` never catches it mid-upload."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import settings

import delta
from delta import read_manifest
from tests._trainer_stack import tiny_model, wait_until
from trainer_space import TrainerConfig, TrainingSession
from wire.rollout import Trajectory


class FirstStepThenHang:
    """Plays the first step's games (fixed tokens, rewards that differ within each group), then holds
    every later request until `release` is set, as a rollout stuck in a long batch does."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def rollout(self, games: Sequence[dict], **_: object) -> list[Trajectory]:
        self.calls += 1
        if self.calls > 1:
            self.release.wait()
        return [Trajectory(prompt_ids=[5, 6, 7], episode_id=f"g{self.calls}-{i}", completion_ids=[8, 9],
                           logprobs=[-1.0, -1.0], env_mask=[1, 1], reward=float(i % 2), secret="crane", versions=[0])
                for i, _ in enumerate(games)]


def test_stop_leaves_a_hung_step_and_commits_the_last_finished_version(tmp_path) -> None:
    assert settings.SHUTDOWN_GRACE_S + settings.TRAINER_STEP_WAIT_S + settings.TRAINER_FLUSH_S < settings.STOP_TIMEOUT_S
    bucket = str(tmp_path / "bucket")
    config = TrainerConfig(bucket, "http://unused", tiny_model(str(tmp_path / "model")), games_per_step=4,
                           num_generations=2, max_tokens=2, max_turns=1, learning_rate=1e-3)
    client = FirstStepThenHang()
    session = TrainingSession(config, client=client)
    session.start()
    try:
        wait_until(lambda: client.calls >= 2, 120, "the second step to ask for games")
        began = time.monotonic()
        session.close(step_wait=1.0, flush_timeout=60.0)
        took = time.monotonic() - began
        assert took < 30, f"close waited {took:.0f} s for a step that cannot end"
        manifest = read_manifest(delta.open_storage(bucket))
        assert manifest is not None and manifest.latest.version == 1  # step 1's version, committed
        assert session.status().trainer_version == 1
    finally:
        client.release.set()
        session.wait(60)
