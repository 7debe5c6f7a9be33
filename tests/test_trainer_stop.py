"""A trainer told to stop does not wait for its step (a CPU step takes a minute): a step computing is ended part
way (`models.interrupt.Breaker`), a step hung elsewhere is left; either way the last finished version is committed
and `close` returns within its budget, so the process exits within `settings.STOP_WITHIN_S`, long before the
launcher's kill after `settings.STOP_TIMEOUT_S`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import settings

import delta
from delta import read_manifest
from tests._trainer_stack import tiny_model, wait_until
from trainer_space import TrainerConfig, build_session
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


def test_the_stop_budget_fits_the_promise() -> None:
    # The trainer: the step's wait runs beside the server's shutdown (both start at the signal), then the abandon,
    # then the flush, all cut to TRAINER_CLOSE_S from the signal. The rollout: the server's shutdown, its threads,
    # its engine. Both end before the process's deadline, which ends it before the promise and the launcher's kill.
    trainer = max(settings.SHUTDOWN_GRACE_S, settings.TRAINER_STEP_WAIT_S) + settings.TRAINER_ABANDON_S
    assert trainer < settings.TRAINER_CLOSE_S < settings.STOP_DEADLINE_S
    rollout = settings.SHUTDOWN_GRACE_S + settings.ROLLOUT_CLOSE_S + settings.ENGINE_CLOSE_S
    assert rollout < settings.STOP_DEADLINE_S < settings.STOP_WITHIN_S < settings.STOP_TIMEOUT_S


class Instant(FirstStepThenHang):
    """Plays every step's games at once: the steps only compute."""

    def rollout(self, games: Sequence[dict], **kwargs: object) -> list[Trajectory]:
        self.release.set()
        return super().rollout(games, **kwargs)


def test_a_step_computing_at_the_stop_is_ended_part_way_and_nothing_of_it_is_published(tmp_path, caplog) -> None:
    bucket = str(tmp_path / "bucket")
    config = TrainerConfig(bucket, "http://unused", tiny_model(str(tmp_path / "model")), games_per_step=4,
                           num_generations=2, max_tokens=2, max_turns=1, learning_rate=1e-3)
    caplog.set_level(logging.INFO, logger="trainer_space.session")
    session = build_session(config, client=Instant())
    parts = session.load()
    slow, computing, closing = threading.Event(), threading.Event(), threading.Event()

    after_close: list[int] = []  # forwards begun once the close began

    def big_model_on_a_slow_cpu(*_: object) -> None:  # each forward of the model takes a second from step 2 on
        if slow.is_set():
            if closing.is_set():
                after_close.append(1)
            computing.set()
            time.sleep(1.0)

    parts.model.model.layers[0].register_forward_hook(big_model_on_a_slow_cpu)
    session.start()
    try:
        wait_until(lambda: parts.version >= 1, 120, "step 1's version to be committed")
        slow.set()
        assert computing.wait(120), "step 2 never computed"
        closing.set()
        assert session.close(step_wait=0.5, abandon_wait=10.0, flush_timeout=30.0)  # every thread ended
    finally:
        slow.clear()
        session.wait(60)
    assert len(after_close) <= 1, f"{len(after_close)} forwards ran after the close began: the step was not ended"
    assert session.state == "stopped" and session.error is None
    assert "stopped part way through step" in caplog.text
    manifest = read_manifest(delta.Bucket.open(bucket))
    status = session.status()
    # Everything handed to the publisher is committed, whole, and the committed version holds every finished step;
    # the step ended part way left no record, no count and no version.
    assert manifest.latest.version == status.version == status.trainer_version
    assert session.records[-1].step == status.step == session.steps


def test_stop_leaves_a_hung_step_and_commits_the_last_finished_version(tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    config = TrainerConfig(bucket, "http://unused", tiny_model(str(tmp_path / "model")), games_per_step=4,
                           num_generations=2, max_tokens=2, max_turns=1, learning_rate=1e-3)
    client = FirstStepThenHang()
    session = build_session(config, client=client)
    session.start()
    try:
        wait_until(lambda: client.calls >= 2, 120, "the second step to ask for games")
        assert not session.close(step_wait=1.0, abandon_wait=1.0, flush_timeout=60.0)  # the step's thread runs on
        manifest = read_manifest(delta.Bucket.open(bucket))
        assert manifest is not None and manifest.latest.version == 1  # step 1's version, committed
        assert session.status().trainer_version == 1
    finally:
        client.release.set()
        session.wait(60)


def test_a_paused_run_holds_between_steps_and_says_so(tmp_path) -> None:
    """A pause takes effect at the end of the step in flight: `held` says when the trainer waits there (nothing after
    it is trained while paused), and a start goes on from there."""
    bucket = str(tmp_path / "bucket")
    config = TrainerConfig(bucket, "http://unused", tiny_model(str(tmp_path / "model")), games_per_step=4,
                           num_generations=2, max_tokens=2, max_turns=1, learning_rate=1e-3, max_steps=3)
    client = FirstStepThenHang()
    session = build_session(config, client=client)
    session.start()
    try:
        wait_until(lambda: client.calls >= 2, 120, "the second step to ask for games")  # step 2 in flight, held up
        session.pause()
        status = session.status()
        assert status.state == "paused" and not status.held and len(session.records) == 1  # step 2 in flight
        client.release.set()
        held = wait_until(lambda: (s := session.status()).held and s, 120, "the run to hold after step 2")
        assert held.state == "paused" and len(session.records) == 2 and client.calls == 2  # no step 3 asked for
        session.start()
        assert session.wait(120) and len(session.records) == 3 and not session.status().held
    finally:
        session.close(step_wait=1.0, abandon_wait=1.0, flush_timeout=30.0)
