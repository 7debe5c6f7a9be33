"""The TrainerCallback that connects a GRPO run to its session's hooks (kept apart: it imports transformers).

It knows the session only as `StepHooks` (`TrainingSession` has them), so this module imports nothing
of `session.py`, which imports it when it builds a run.
"""

from __future__ import annotations

from typing import Any, Protocol

from transformers import TrainerCallback


class StepHooks(Protocol):
    """What `SessionCallback` calls, from the training thread (see `TrainingSession.on_step_end`, `on_log`,
    `after_step`)."""

    def on_step_end(self) -> None: ...

    def on_log(self, logs: dict[str, float]) -> None: ...

    def after_step(self, control: Any) -> None: ...


class SessionCallback(TrainerCallback):
    """A step's end, its metrics from TRL's logs (`logging_steps=1`), then pause and stop. Transformers logs a
    step after its `on_step_end`, so pausing there held the step's record back for the whole pause: the pause
    waits after the step's log (the one with "loss"), where `should_training_stop` is still read."""

    def __init__(self, hooks: StepHooks) -> None:
        self.hooks = hooks

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.hooks.on_step_end()
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        if logs:
            self.hooks.on_log(logs)
            if "loss" in logs:  # the step's own log, not the run's summary ("train_loss")
                self.hooks.after_step(control)
        return control
