"""`python app.py rollout`: the rollout server, wired in one place.

    config  ->  engine plan  ->  bucket (the trainer's key trusted)  ->  engine  ->  follower  ->  env client  ->
    service  ->  producer of the fleet's games (or a watch of the run's settings)  ->  serve

Everything the server reads and writes in the bucket goes through the one `delta.Bucket` opened here: the weights'
subscriber, the run's settings, the heartbeats, the groups and the exams share its listing, its traffic, its 429 hold
and its trust (the trainer's key, given or trusted on first use), and its budget sets every interval.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from typing import Any

import delta
import settings
from fleet.bucket import FleetBucket

from .engines import EngineConfig, open_engine
from .env_client import EnvClient
from .follower import Follower
from .launch import RolloutConfig, default_engine, engine_plan
from .producer import server_id_from
from .service import RolloutService, ServiceLimits

logger = logging.getLogger(__name__)


def run(flags: argparse.Namespace) -> None:
    """Load the model, start following the bucket, produce the fleet's games (unless --no-produce), serve until
    interrupted."""
    from models import resolve_model

    from .server import serve

    args = settings.from_flags(RolloutConfig, flags)
    kind = args.engine or default_engine()
    folder = resolve_model(args.model)
    bucket = delta.Bucket.open(args.bucket, trusted_key=args.trusted_key, unauthenticated=args.unauthenticated)
    try:
        plan = engine_plan(args, kind, folder)
        trust = bucket.trust  # the weights' and the run settings' (the trainer's key): read before anything starts
    except (ValueError, OSError) as e:  # a setting to change: one line, no traceback (PrivateFileError: an OSError)
        raise SystemExit(f"python app.py rollout: {e}") from None
    logger.info("starting the %s engine on %s (%s, %s)", kind, folder, plan.device, plan.dtype)
    options: dict[str, Any] = {"plan": plan, "max_lora_rank": args.max_lora_rank} if kind == "vllm" else {}
    engine = open_engine(kind, EngineConfig(folder, plan.dtype, args.max_model_len, plan.device), **options)
    try:
        follower = Follower(engine, bucket, delta.SubscriberConfig(poll_interval=args.poll_interval))
        env = EnvClient(args.env_url, token=args.env_token)
    except BaseException:
        engine.close()
        raise
    limits = ServiceLimits(args.max_batch, args.max_tokens, args.max_games, args.showcase_every)
    service = RolloutService(engine, follower, env, limits, model=args.model, engine_kind=kind)
    fleet = FleetBucket(bucket, secret=args.token)  # the rollout token, shared with the trainer, signs the files
    if args.no_produce:  # no games for the fleet, but the state the run names (a LoRA run's adapter) is followed
        service.watch_run(fleet, poll_s=follower.poll_s)
    else:
        server_id = server_id_from(
            args.server_id or os.environ.get("SPACE_ID") or f"{socket.gethostname()}-{args.port}"
        )
        service.attach_producer(fleet, server_id, poll_s=follower.poll_s, first_step_alone=args.first_step_alone)
        logger.info("producing games for the fleet in %s as %s", args.bucket, server_id)
    where = f"http://{args.host}:{args.port}"
    logger.info("serving version %d on %s (bucket %s, env %s)", engine.version, where, args.bucket, args.env_url)
    logger.info("weights and run settings checked with: %s", trust.describe())
    if not args.token:
        logger.warning(
            "no rollout token (--token / ROLLOUT_TOKEN): anyone may call /generate and /rollout; set one "
            "on a public Space (python app.py and spaces/deploy.py do)"
        )
    # A Space (SPACE_ID set) is reached only through its proxy, whose X-Forwarded-For can be trusted.
    serve(service, args.host, args.port, args.token, trust_forwarded=bool(os.environ.get("SPACE_ID")))
