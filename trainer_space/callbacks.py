"""The TrainerCallback that connects a GRPO run to its session's hooks (kept apart: it imports transformers).

It knows the session only as `StepHooks` (`TrainingSession` has them), so this module imports nothing
of `session.py`, which imports it when it builds a run.
"""

from __future__ import annotations

from typing import Any, Protocol

from transformers import TrainerCallback


class StepHooks(Protocol):
    """What `SessionCallback` calls, from the training thread (see `TrainingSession.on_step_end`, `on_log`)."""

    def on_step_end(self, control: Any) -> None: ...

    def on_log(self, logs: dict[str, float]) -> None: ...


class SessionCallback(TrainerCallback):
    """Pause and stop at step ends; per-step metrics from TRL's logs (`logging_steps=1`)."""

    def __init__(self, hooks: StepHooks) -> None:
        self.hooks = hooks

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.hooks.on_step_end(control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        if logs:
            self.hooks.on_log(logs)
        return control
