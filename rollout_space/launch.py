"""`python app.py rollout`: flags (defaults from the Space's environment variables) and start-up."""

from __future__ import annotations

import argparse
import logging
import os
import socket

import settings

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
    parser.add_argument("--token", default=settings.ROLLOUT_TOKEN.value(),
                        help="secret /generate and /rollout require as a bearer token (env ROLLOUT_TOKEN; the "
                             "trainer's --rollout-token); unset: anyone may call them")
    settings.ENV_TOKEN.add_to(parser, "the env's token, sent on this server's games (the env's --token)")
    settings.ENGINE.add_to(parser)
    settings.DEVICE.add_to(parser, f"where the transformers engine runs: {', '.join(settings.DEVICE_CHOICES)} or "
                                   "cuda:N (auto: the GPU when there is one); vLLM runs on its platform's device")
    parser.add_argument("--dtype", default="auto", help="compute dtype: auto, bfloat16, float16, float32")
    parser.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + completion in tokens")
    parser.add_argument("--max-batch", type=int, default=256, help="most prompts per /generate call")
    parser.add_argument("--max-tokens", type=int, default=1024, help="most tokens per completion")
    parser.add_argument("--max-games", type=int, default=256, help="most games per /rollout call")
    parser.add_argument("--poll-interval", type=float, default=None,
                        help="seconds between bucket polls (default: delta.SubscriberConfig's, 1 s)")
    parser.add_argument("--server-id", default=os.environ.get("ROLLOUT_ID") or None,
                        help="this server's name in the fleet (env ROLLOUT_ID; default: the Space id, or host-port)")
    parser.add_argument("--no-produce", action="store_true",
                        help="play no games for the fleet: answer /generate and /rollout requests only")
    parser.add_argument("--showcase-every", type=float, default=60.0,
                        help="play a game on its own after this many idle seconds, for the UI (0: never)")
    settings.add_server_arguments(parser)


def run(args: argparse.Namespace) -> None:
    """Load the model, start following the bucket, serve until interrupted."""
    from delta.subscribe import SubscriberConfig
    from models import resolve_device, resolve_model

    from .engines import EngineConfig, open_engine
    from .env_client import EnvClient
    from wire.fleet_bucket import FleetBucket

    from .follower import Follower
    from .producer import server_id_from
    from .server import serve
    from .service import RolloutService, ServiceLimits

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    limits = ServiceLimits(args.max_batch, args.max_tokens, args.max_games, args.showcase_every)
    kind = args.engine or _default_engine()
    folder = resolve_model(args.model)
    logger.info("starting the %s engine on %s", kind, folder)
    engine = open_engine(kind, EngineConfig(folder, args.dtype, args.max_model_len, resolve_device(args.device)))
    try:
        polling = SubscriberConfig() if args.poll_interval is None else SubscriberConfig(poll_interval=args.poll_interval)
        follower = Follower(engine, args.bucket, polling)
        env = EnvClient(args.env_url, token=args.env_token)
    except BaseException:
        engine.close()
        raise
    service = RolloutService(engine, follower, env, limits, model=args.model, engine_kind=kind)
    if not args.no_produce:
        server_id = server_id_from(args.server_id or os.environ.get("SPACE_ID") or f"{socket.gethostname()}-{args.port}")
        service.attach_producer(FleetBucket(args.bucket), server_id)
        logger.info("producing games for the fleet in %s as %s", args.bucket, server_id)
    logger.info("serving version %d on http://%s:%d (bucket %s, env %s)", engine.version, args.host, args.port,
                args.bucket, args.env_url)
    if not args.token:
        logger.warning("no rollout token (--token / ROLLOUT_TOKEN): anyone may call /generate and /rollout; set one "
                       "on a public Space (python app.py and spaces/deploy.py do)")
    # A Space (SPACE_ID set) is reached only through its proxy, whose X-Forwarded-For can be trusted.
    serve(service, args.host, args.port, args.token, trust_forwarded=bool(os.environ.get("SPACE_ID")))
