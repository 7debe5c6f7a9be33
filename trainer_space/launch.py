"""`python app.py trainer`: flags (defaults from the Space's environment variables) and start-up."""

from __future__ import annotations

import argparse
import logging
import os

from models import DEFAULT_MODEL, DEVICE_CHOICES

from .config import TrainerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The trainer role's flags; each of the first ones defaults to the environment variable a Space sets."""
    env = os.environ.get
    defaults = TrainerConfig("", "", "")
    parser.add_argument("--bucket", default=env("DELTA_BUCKET", ".cache/bucket"),
                        help="bucket to publish to and resume from: a folder, s3://..., hf://buckets/NS/NAME "
                             "(env DELTA_BUCKET; default .cache/bucket)")
    parser.add_argument("--rollout-url", default=env("ROLLOUT_URL", "http://127.0.0.1:7862"),
                        help="the rollout Space that plays the games (env ROLLOUT_URL)")
    parser.add_argument("--rollout-token", default=env("ROLLOUT_TOKEN") or None,
                        help="the rollout Space's token, sent with every request (env ROLLOUT_TOKEN; its --token)")
    parser.add_argument("--env-url", default=env("ENV_URL", "http://127.0.0.1:7861"),
                        help="the Wordle env Space, linked from the UI (env ENV_URL)")
    parser.add_argument("--model", default=env("MODEL", DEFAULT_MODEL),
                        help=f"model folder or Hub id to start from (env MODEL; default {DEFAULT_MODEL}, offline); "
                             "the rollout's model")
    parser.add_argument("--owner-token", default=env("OWNER_TOKEN") or None,
                        help="secret that start/pause/stop need (env OWNER_TOKEN; unset: nobody controls it)")
    parser.add_argument("--device", default=env("DEVICE", "auto"),
                        help=f"where the weights train: {', '.join(DEVICE_CHOICES)} or cuda:N (env DEVICE; default auto: "
                             "the GPU when there is one)")
    parser.add_argument("--paused", action="store_true", help="do not start training on launch")
    parser.add_argument("--max-steps", type=int, default=defaults.max_steps, help="optimizer steps per run")
    parser.add_argument("--games-per-step", type=int, default=defaults.games_per_step,
                        help="games per optimizer step (a multiple of --num-generations)")
    parser.add_argument("--num-generations", type=int, default=defaults.num_generations,
                        help="games per secret word: the GRPO group")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens per model turn")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="guesses per game")
    parser.add_argument("--reply-prefix", default=defaults.reply_prefix,
                        help=f"text that opens each reply, written for the policy (default {defaults.reply_prefix!r}; "
                             "'' lets the model write it all)")
    parser.add_argument("--max-staleness", type=int, default=defaults.max_staleness,
                        help="most versions a game's weights may lag the trainer's")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", "7860")))


def config_from_args(args: argparse.Namespace, model_folder: str) -> TrainerConfig:
    """The session's config from parsed flags (ValueError with the flag to change when invalid)."""
    from models import resolve_device

    return TrainerConfig(
        bucket=args.bucket, rollout_url=args.rollout_url, model=model_folder, env_url=args.env_url,
        games_per_step=args.games_per_step, num_generations=args.num_generations, max_steps=args.max_steps,
        learning_rate=args.learning_rate, device=resolve_device(args.device), max_tokens=args.max_tokens,
        max_turns=args.max_turns, reply_prefix=args.reply_prefix,
        max_staleness=args.max_staleness, seed=args.seed, rollout_token=args.rollout_token)


def run(args: argparse.Namespace) -> None:
    """Resolve the model, start training (unless --paused) and serve the API and UI until interrupted."""
    from models import resolve_model

    from .server import serve
    from .session import TrainingSession

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    session = TrainingSession(config_from_args(args, resolve_model(args.model)), owner_token=args.owner_token)
    if args.paused:
        session.pause()
    else:
        session.start()
    logging.getLogger(__name__).info("trainer on http://%s:%d (bucket %s, rollout %s)", args.host, args.port,
                                     args.bucket, args.rollout_url)
    serve(session, args.host, args.port)
