"""`python app.py trainer`: flags (defaults from the Space's environment variables) and start-up."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

import settings
from wire.curriculum import ExampleMode, ExampleSchedule
from wire.lora import LORA_SYNCS

from .config import TrainerConfig
from .credit import CREDITS

if TYPE_CHECKING:
    from models.hardware import Machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The trainer role's flags; each of the first ones defaults to the environment variable a Space sets."""
    defaults = TrainerConfig("", None, "")
    settings.BUCKET.add_to(parser, "bucket to publish to and resume from: a folder, s3://..., hf://buckets/NS/NAME")
    settings.ROLLOUT_URL.add_to(parser)
    settings.ROLLOUT_TOKEN.add_to(parser, "the rollout Space's token, sent with every request (its --token)")
    settings.ENV_URL.add_to(parser, "the Wordle env Space, linked from the UI")
    settings.MODEL.add_to(parser, "model folder or Hub id to start from (offline default); the rollout's model")
    settings.OWNER_TOKEN.add_to(parser, "secret that start/pause/stop need (unset: nobody controls it)")
    settings.DEVICE.add_to(
        parser,
        f"where the weights train: {', '.join(settings.DEVICE_CHOICES)} (auto: the GPU "
        "when there is one; one GPU: with several, set CUDA_VISIBLE_DEVICES)",
    )
    parser.add_argument("--paused", action="store_true", help="do not start training on launch")
    parser.add_argument("--max-steps", type=int, default=defaults.max_steps, help="optimizer steps per run")
    parser.add_argument(
        "--games-per-step",
        type=int,
        default=defaults.games_per_step,
        help="games per optimizer step (a multiple of --num-generations)",
    )
    parser.add_argument(
        "--num-generations", type=int, default=defaults.num_generations, help="games per secret word: the GRPO group"
    )
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens per model turn")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="guesses per game")
    parser.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        help="sampling temperature of the training games (and of the exams, unless --exam-greedy)",
    )
    parser.add_argument(
        "--credit",
        choices=CREDITS,
        default=defaults.credit,
        help="what GRPO trains with which reward: one move per group with its own reward (move), or "
        "every move with the game's total (game); see docs/training.md",
    )
    parser.add_argument(
        "--reply-prefix",
        default=defaults.reply_prefix,
        help=f"text that opens each reply, written for the policy (default {defaults.reply_prefix!r}; "
        "'' lets the model write it all)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=defaults.max_staleness,
        help="most versions a game's weights may lag the trainer's",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    schedule = defaults.examples
    parser.add_argument(
        "--examples",
        choices=[str(m) for m in ExampleMode],
        default=str(schedule.mode),
        help="whether training games show the env's example guess: off, fixed (every message) or "
        f"fading (every message up to --fade-start, none from --fade-end; default "
        f"{schedule.mode}); see docs/training.md",
    )
    parser.add_argument(
        "--fade-start",
        type=int,
        default=schedule.start,
        help="fading: the last weight version whose games show every example",
    )
    parser.add_argument(
        "--fade-end", type=int, default=schedule.end, help="fading: the first weight version whose games show none"
    )
    parser.add_argument(
        "--exam-every",
        type=int,
        default=defaults.exam_every,
        help="an exam every this many versions (and of version 0): held-out words, no examples, "
        "never trained on; 0: no exams",
    )
    parser.add_argument("--exam-games", type=int, default=defaults.exam_games, help="held-out words an exam plays")
    parser.add_argument("--exam-turns", type=int, default=None, help="replies per exam game (default: --max-turns)")
    parser.add_argument(
        "--kl",
        type=float,
        default=defaults.kl,
        help="weight of the KL divergence to the model folder's weights in GRPO's loss (TRL's beta; "
        "default 0: no reference model loaded)",
    )
    parser.add_argument(
        "--exam-greedy",
        action="store_true",
        help="exams sample greedily (default: at the training temperature, with a fixed seed)",
    )
    parser.add_argument(
        "--lora-r",
        type=int,
        default=defaults.lora_r,
        help="train a LoRA adapter of this rank instead of every weight (default 0: no adapter; needs the "
        "fleet; merged runs an empty bucket); see the README's LoRA section",
    )
    parser.add_argument("--lora-alpha", type=float, default=None, help="LoRA's alpha (default: 2 * --lora-r)")
    parser.add_argument(
        "--lora-targets",
        default=",".join(defaults.lora_targets),
        help="comma-separated names of the modules adapted (default: every attention and MLP projection)",
    )
    parser.add_argument(
        "--lora-sync",
        choices=LORA_SYNCS,
        default=defaults.lora_sync,
        help="how the adapter reaches the rollout servers: merged (the base with the adapter merged in, "
        "as deltas of the served weights) or adapter (the adapter's tensors alone, applied under PEFT)",
    )
    parser.add_argument(
        "--handover-from-file",
        default=None,
        metavar="FILE",
        help="the trainer's previous signing key, when its key replaces it: a file of yours holding its text "
        "(ed25519-private:...) or a key file kept in ~/.cache/delta/keys; rollout servers that trust it follow the "
        "new key (env DELTA_HANDOVER_FROM: the key's text; never the key on the command line)",
    )
    settings.add_server_arguments(parser)


def config_from_args(args: argparse.Namespace, model_folder: str, machine: Machine | None = None) -> TrainerConfig:
    """The session's config from parsed flags, for `machine` (None: this one, probed); ValueError with the
    flag or variable to change when invalid (a device that is not there, several visible GPUs)."""
    from models.hardware import Machine, log_notes, plan_trainer

    plan = plan_trainer(machine or Machine.probe(), args.device)
    log_notes(plan.notes)
    return TrainerConfig(
        bucket=args.bucket,
        rollout_url=args.rollout_url,
        model=model_folder,
        env_url=args.env_url,
        games_per_step=args.games_per_step,
        num_generations=args.num_generations,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        device=plan.device,
        bf16=plan.bf16,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        temperature=args.temperature,
        credit=args.credit,
        reply_prefix=args.reply_prefix,
        max_staleness=args.max_staleness,
        seed=args.seed,
        rollout_token=args.rollout_token,
        examples=ExampleSchedule(mode=ExampleMode(args.examples), start=args.fade_start, end=args.fade_end),
        exam_every=args.exam_every,
        exam_games=args.exam_games,
        exam_turns=args.exam_turns,
        exam_greedy=args.exam_greedy,
        kl=args.kl,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_targets=tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()),
        lora_sync=args.lora_sync,
        handover_from_file=args.handover_from_file,
    )


def run(args: argparse.Namespace) -> None:
    """Resolve the model, start training (unless --paused) and serve the API and UI until interrupted."""
    from models import resolve_model

    from .ranks import TrainerRanks
    from .session import TrainingSession

    try:
        config = config_from_args(args, resolve_model(args.model))
    except ValueError as e:  # a setting to change before anything loads: one line, no traceback
        raise SystemExit(f"python app.py trainer: {e}") from None
    ranks = TrainerRanks.from_environment()
    from delta import DeltaError

    try:
        session = TrainingSession(config, owner_token=args.owner_token, ranks=ranks)
    except (DeltaError, FileNotFoundError) as e:  # a signing key's file or variable (no key quoted), or the bucket
        raise SystemExit(f"python app.py trainer: {e}") from None
    if not ranks.main:  # trains beside rank 0, which serves the UI and decides start, pause and stop
        logging.getLogger(__name__).info("trainer rank %d of %d (rank 0 serves the UI)", ranks.rank, ranks.world)
        session.start()
        session.wait()
        session.close()
        if session.error:
            raise SystemExit(f"python app.py trainer, rank {ranks.rank}: {session.error}")
        return
    if args.paused:
        session.pause()
    else:
        session.start()
    # Gradio (the UI) is a heavy import: after the start, which writes the run's settings the rollout servers wait
    # for and begins loading the model in the training thread, so that neither waits on it.
    from .server import serve

    games = f"rollout {args.rollout_url}" if args.rollout_url else "games from the fleet through the bucket"
    logging.getLogger(__name__).info(
        "trainer on http://%s:%d (bucket %s, %s)", args.host, args.port, args.bucket, games
    )
    serve(session, args.host, args.port)
