"""`python app.py trainer`: its flags, made from `TrainerConfig`'s fields (defaults from the Space's environment
variables), light to import: a usage error is answered before torch loads. The trainer is wired in `main`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import settings

from .config import TrainerConfig

if TYPE_CHECKING:
    from models.hardware import Machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The trainer role's flags: its config's fields, then what the process itself takes (the device to plan for,
    the owner's token, whether to start paused, where to listen)."""
    settings.add_flags(parser, TrainerConfig)
    settings.OWNER_TOKEN.add_to(parser, "secret that start/pause/stop need (unset: nobody controls it)")
    settings.DEVICE.add_to(
        parser,
        f"where the weights train: {', '.join(settings.DEVICE_CHOICES)} (auto: the GPU when there is one; one GPU: "
        "with several, set CUDA_VISIBLE_DEVICES)",
    )
    parser.add_argument("--paused", action="store_true", help="do not start training on launch")
    settings.add_server_arguments(parser)


def config_from_args(args: argparse.Namespace, model_folder: str, machine: Machine | None = None) -> TrainerConfig:
    """The session's config from parsed flags, for `machine` (None: this one, probed); ValueError with the
    flag or variable to change when invalid (a device that is not there, several visible GPUs)."""
    from models.hardware import Machine, log_notes, plan_trainer

    plan = plan_trainer(machine or Machine.probe(), args.device)
    log_notes(plan.notes)
    return settings.from_flags(TrainerConfig, args, model=model_folder, device=plan.device, bf16=plan.bf16)
