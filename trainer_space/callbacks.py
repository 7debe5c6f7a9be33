"""The TrainerCallback that connects a GRPO run to its `TrainingSession` (kept apart: it imports transformers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from .session import TrainingSession


class SessionCallback(TrainerCallback):
    """Pause and stop at step ends; per-step metrics from TRL's logs (`logging_steps=1`)."""

    def __init__(self, session: TrainingSession) -> None:
        self.session = session

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.session.on_step_end(control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        if logs:
            self.session.on_log(logs)
        return control
