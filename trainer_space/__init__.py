"""The trainer Space: TRL's GRPO on Wordle, with rollouts from the rollout Space and a delta published
to the bucket after every optimizer step.

    >>> from trainer_space import TrainerConfig, build_session
    >>> session = build_session(TrainerConfig(bucket="./bucket", rollout_url="http://127.0.0.1:7862",
    ...                                       model="/path/to/model"))
    >>> session.start()          # trains in a background thread; session.status() tells how it goes

`python app.py trainer ...` (the one entry point, with the launcher's checks) serves it with its HTTP API and UI.
Heavy imports (torch, TRL, Gradio) happen inside the modules that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wire.trainer import TrainerState

from .config import TrainerConfig

if TYPE_CHECKING:
    from .main import build_session
    from .session import TrainingSession

__all__ = ["TrainerConfig", "TrainerState", "TrainingSession", "build_session"]


def __getattr__(name: str) -> Any:
    """`TrainingSession` and `build_session` are imported on first use: they load torch, and importing the package
    for `TrainerConfig` (``trainer_space.launch`` reads its flags' defaults there) must not."""
    if name == "TrainingSession":
        from .session import TrainingSession

        return TrainingSession
    if name == "build_session":
        from .main import build_session

        return build_session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
