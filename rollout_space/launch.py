"""`python app.py rollout`: its flags (defaults from the Space's environment variables) and the engine's plan,
light to import: a usage error is answered before torch loads. The server is wired in `main`."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import settings
from settings import flag

if TYPE_CHECKING:
    from models.hardware import Machine, RolloutPlan

logger = logging.getLogger(__name__)


def default_engine() -> str:
    """vLLM where a GPU is; transformers on CPUs, where vLLM starts in ~1 min and serves a small model no faster."""
    import torch

    return "vllm" if torch.cuda.is_available() else "transformers"


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout server's settings, each field's help its flag's (`settings.add_flags`); the engine's device and
    dtype are planned from them for the machine (`engine_plan`)."""

    bucket: str = field(
        metadata=flag("bucket the trainer publishes to: a folder, s3://..., hf://buckets/NS/NAME", settings.BUCKET)
    )
    model: str = field(metadata=flag("model folder or Hub id the trainer started from", settings.MODEL))
    env_url: str = field(metadata=flag(settings.ENV_URL.help, settings.ENV_URL))
    token: str | None = field(
        default_factory=settings.ROLLOUT_TOKEN.value,
        metadata=flag(
            "secret /generate and /rollout require as a bearer token (env ROLLOUT_TOKEN; the trainer's "
            "--rollout-token); unset: anyone may call them"
        ),
    )
    env_token: str | None = field(
        default=None,
        metadata=flag("the env's token, sent on this server's games (the env's --token)", settings.ENV_TOKEN),
    )
    trusted_key: str | None = field(default=None, metadata=flag(settings.TRUSTED_KEY.help, settings.TRUSTED_KEY))
    unauthenticated: bool = field(
        default=False,
        metadata=flag(
            "follow an unsigned bucket (TRL's own delta files, an older delta's): the weights and run "
            "settings are used whoever wrote them, and every page says so"
        ),
    )
    engine: str | None = field(default=None, metadata=flag(settings.ENGINE.help, settings.ENGINE))
    device: str = field(
        default="auto",
        metadata=flag(
            f"where the transformers engine runs: {', '.join(settings.DEVICE_CHOICES)} or cuda:N (auto: the "
            "GPU when there is one); vLLM runs on the first visible GPU (for another, set "
            "CUDA_VISIBLE_DEVICES)",
            settings.DEVICE,
        ),
    )
    dtype: str = field(default="auto", metadata=flag(settings.DTYPE.help, settings.DTYPE))
    gpu_memory_utilization: float | None = field(
        default=None, metadata=flag(settings.GPU_MEMORY_UTILIZATION.help, settings.GPU_MEMORY_UTILIZATION)
    )
    cuda_graphs: str = field(default="on", metadata=flag(settings.CUDA_GRAPHS.help, settings.CUDA_GRAPHS))
    max_lora_rank: int = field(default=0, metadata=flag(settings.MAX_LORA_RANK.help, settings.MAX_LORA_RANK))
    max_model_len: int = field(default=2048, metadata=flag("longest prompt + completion in tokens"))
    max_batch: int = field(default=256, metadata=flag("most prompts per /generate call"))
    max_tokens: int = field(default=1024, metadata=flag("most tokens per completion"))
    max_games: int = field(default=256, metadata=flag("most games per /rollout call"))
    poll_interval: float | None = field(
        default=None,
        metadata=flag(
            "seconds between bucket polls while things change, for new weights and for the fleet's run and "
            "room (default: the bucket's budget: 1 s; 2 s on hf://, stretched up to 30 s while nothing "
            "changes)"
        ),
    )
    server_id: str | None = field(
        default_factory=lambda: os.environ.get("ROLLOUT_ID") or None,
        metadata=flag("this server's name in the fleet (env ROLLOUT_ID; default: the Space id, or host-port)"),
    )
    no_produce: bool = field(
        default=False, metadata=flag("play no games for the fleet: answer /generate and /rollout requests only")
    )
    first_step_alone: bool = field(
        default=False,
        metadata=flag(
            "after the first batch of a run, play nothing until the trainer has published its first step: "
            "for a server that shares the trainer's cores (python app.py sets it)"
        ),
    )
    showcase_every: float = field(
        default=60.0, metadata=flag("play a game on its own after this many idle seconds, for the UI (0: never)")
    )
    host: str = field(default=settings.DEFAULT_HOST, metadata=flag(settings.HOST.help, settings.HOST))
    port: int = field(default=settings.DEFAULT_PORT, metadata=flag(settings.PORT.help, settings.PORT))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The rollout role's flags: `RolloutConfig`'s fields, each defaulting to the environment variable a Space sets."""
    settings.add_flags(parser, RolloutConfig)


def engine_plan(args: RolloutConfig | Any, kind: str, folder: str, machine: Machine | None = None) -> RolloutPlan:
    """What the engine runs with on `machine` (None: this one, probed), from the flags and the checkpoint's
    dtypes; its warnings are logged.

    Raises:
        ValueError: settings that cannot start, or would serve other weights than published unasked (a T4
            with bf16 weights under vLLM); the message says what to set.
    """
    from models.hardware import Machine, log_notes, plan_rollout, published_dtypes

    plan = plan_rollout(
        machine or Machine.probe(),
        engine=kind,
        published=published_dtypes(folder),
        device=args.device,
        dtype=args.dtype,
        memory_fraction=args.gpu_memory_utilization,
        cuda_graphs=args.cuda_graphs == "on",
    )
    log_notes(plan.notes)
    return plan
