"""`python app.py rollout`: flags (defaults from the Space's environment variables) and start-up."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from typing import TYPE_CHECKING

import settings

if TYPE_CHECKING:
    from models.hardware import Machine, RolloutPlan

logger = logging.getLogger(__name__)


def _default_engine() -> str:
    """vLLM where a GPU is; transformers on CPUs, where vLLM starts in ~1 min and serves a small model no faster."""
    import torch

    return "vllm" if torch.cuda.is_available() else "transformers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The rollout role's flags; each defaults to the environment variable a Space would set."""
    settings.BUCKET.add_to(parser, "bucket the trainer publishes to: a folder, s3://..., hf://buckets/NS/NAME")
    settings.MODEL.add_to(parser, "model folder or Hub id the trainer started from (offline default)")
    settings.ENV_URL.add_to(parser)
    parser.add_argument(
        "--token",
        default=settings.ROLLOUT_TOKEN.value(),
        help="secret /generate and /rollout require as a bearer token (env ROLLOUT_TOKEN; the "
        "trainer's --rollout-token); unset: anyone may call them",
    )
    settings.ENV_TOKEN.add_to(parser, "the env's token, sent on this server's games (the env's --token)")
    settings.TRUSTED_KEY.add_to(parser)
    parser.add_argument(
        "--unauthenticated",
        action="store_true",
        help="follow an unsigned bucket (TRL's own delta files, an older delta's): the weights and run "
        "settings are used whoever wrote them, and every page says so",
    )
    settings.ENGINE.add_to(parser)
    settings.DEVICE.add_to(
        parser,
        f"where the transformers engine runs: {', '.join(settings.DEVICE_CHOICES)} or "
        "cuda:N (auto: the GPU when there is one); vLLM runs on the first visible GPU "
        "(for another, set CUDA_VISIBLE_DEVICES)",
    )
    settings.DTYPE.add_to(parser)
    settings.GPU_MEMORY_UTILIZATION.add_to(parser)
    settings.CUDA_GRAPHS.add_to(parser)
    settings.MAX_LORA_RANK.add_to(parser)
    parser.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + completion in tokens")
    parser.add_argument("--max-batch", type=int, default=256, help="most prompts per /generate call")
    parser.add_argument("--max-tokens", type=int, default=1024, help="most tokens per completion")
    parser.add_argument("--max-games", type=int, default=256, help="most games per /rollout call")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between bucket polls while things change, for new weights and for the fleet's "
        "run and room (default: the bucket's, wire.budget: 1 s; 2 s on hf://, stretched up to "
        "24 s while nothing changes)",
    )
    parser.add_argument(
        "--server-id",
        default=os.environ.get("ROLLOUT_ID") or None,
        help="this server's name in the fleet (env ROLLOUT_ID; default: the Space id, or host-port)",
    )
    parser.add_argument(
        "--no-produce",
        action="store_true",
        help="play no games for the fleet: answer /generate and /rollout requests only",
    )
    parser.add_argument(
        "--first-step-alone",
        action="store_true",
        help="after the first batch of a run, play nothing until the trainer has published its first "
        "step: for a server that shares the trainer's cores (python app.py sets it), where that "
        "step would otherwise take twice as long",
    )
    parser.add_argument(
        "--showcase-every",
        type=float,
        default=60.0,
        help="play a game on its own after this many idle seconds, for the UI (0: never)",
    )
    settings.add_server_arguments(parser)


def engine_plan(args: argparse.Namespace, kind: str, folder: str, machine: Machine | None = None) -> RolloutPlan:
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


def run(args: argparse.Namespace) -> None:
    """Load the model, start following the bucket, serve until interrupted."""
    from delta import PrivateFileError, SubscriberConfig, Trust, open_storage
    from models import resolve_model
    from wire.budget import budget_for
    from wire.fleet_bucket import FleetBucket

    from .engines import EngineConfig, open_engine
    from .env_client import EnvClient
    from .follower import Follower
    from .producer import server_id_from
    from .server import serve
    from .service import RolloutService, ServiceLimits

    limits = ServiceLimits(args.max_batch, args.max_tokens, args.max_games, args.showcase_every)
    kind = args.engine or _default_engine()
    folder = resolve_model(args.model)
    try:
        plan = engine_plan(args, kind, folder)
        # One trust for the weights and the run's settings: the trainer's key, given or trusted on first use.
        url = open_storage(args.bucket).url
        trust = Trust.unauthenticated_for(url) if args.unauthenticated else Trust.for_bucket(url, args.trusted_key)
    except (ValueError, PrivateFileError) as e:  # a setting to change before anything starts: one line, no traceback
        raise SystemExit(f"python app.py rollout: {e}") from None
    logger.info("starting the %s engine on %s (%s, %s)", kind, folder, plan.device, plan.dtype)
    options = {"plan": plan, "max_lora_rank": args.max_lora_rank} if kind == "vllm" else {}
    engine = open_engine(kind, EngineConfig(folder, plan.dtype, args.max_model_len, plan.device), **options)
    try:
        budget = budget_for(url)
        poll = budget.poll_s if args.poll_interval is None else args.poll_interval
        # On the Hub no version comes sooner than `publish_s` after the last: the first poll after one waits that long.
        after = max(poll, budget.publish_s) if budget.publish_s else None
        idle = max(poll, budget.idle_poll_s)
        polling = SubscriberConfig(poll_interval=poll, idle_poll_max=idle, version_interval=after)
        follower = Follower(engine, args.bucket, polling, trust=trust)
        env = EnvClient(args.env_url, token=args.env_token)
    except BaseException:
        engine.close()
        raise
    service = RolloutService(engine, follower, env, limits, model=args.model, engine_kind=kind)
    if not args.no_produce:
        server_id = server_id_from(
            args.server_id or os.environ.get("SPACE_ID") or f"{socket.gethostname()}-{args.port}"
        )
        # The rollout token, shared with the trainer, signs this server's groups and heartbeats (wire.fleet).
        fleet = FleetBucket(args.bucket, secret=args.token, trust=trust, max_age=budget.listing_age_s)
        service.attach_producer(
            fleet,
            server_id,
            poll_s=poll,
            whole_shares=budget.whole_shares,
            heartbeat_s=budget.heartbeat_s,
            gone_after_s=budget.gone_after_s,
            beat_on_version=budget.beat_on_version,
            first_step_alone=args.first_step_alone,
        )
        logger.info("producing games for the fleet in %s as %s", args.bucket, server_id)
    else:  # no games for the fleet, but the state the run names (a LoRA run's adapter) is still followed
        service.watch_run(
            FleetBucket(args.bucket, secret=args.token, trust=trust, max_age=budget.listing_age_s), poll_s=poll
        )
    logger.info(
        "serving version %d on http://%s:%d (bucket %s, env %s)",
        engine.version,
        args.host,
        args.port,
        args.bucket,
        args.env_url,
    )
    logger.info("weights and run settings checked with: %s", trust.describe())
    if not args.token:
        logger.warning(
            "no rollout token (--token / ROLLOUT_TOKEN): anyone may call /generate and /rollout; set one "
            "on a public Space (python app.py and spaces/deploy.py do)"
        )
    # A Space (SPACE_ID set) is reached only through its proxy, whose X-Forwarded-For can be trusted.
    serve(service, args.host, args.port, args.token, trust_forwarded=bool(os.environ.get("SPACE_ID")))
