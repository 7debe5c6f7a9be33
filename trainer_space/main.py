"""`python app.py trainer`: the trainer, wired in one place.

    config  ->  bucket (the trainer's keys, its resume)  ->  fleet run | rollout client  ->  readers of the
    heartbeats and exams, the history  ->  session  ->  start (the model loads in the training thread)  ->  serve

Everything the trainer reads and writes in its bucket goes through the one `delta.Bucket` opened here (as a writer on
rank 0: its key signs the versions and the run's settings): its budget sets every interval, its listing is shared by
every poller. The session's parts (the model resumed from the bucket, the publisher, the payload log, the rollout
function) are loaded by `parts.load_parts` when the session first starts.
"""

from __future__ import annotations

import argparse
import logging

import delta
from delta.signing import previous_key
from fleet.bucket import FleetBucket
from fleet.history import HistoryKeeper

from .config import TrainerConfig
from .exam import ExamWatch
from .fleet import FleetMonitor, FleetRun
from .keys import trainer_keys
from .launch import config_from_args
from .ranks import TrainerRanks
from .rollouts import RolloutSource
from .session import PublisherWrapper, TrainingSession

logger = logging.getLogger(__name__)


def build_session(
    config: TrainerConfig,
    *,
    owner_token: str | None = None,
    client: RolloutSource | None = None,
    wrap_publisher: PublisherWrapper | None = None,
    ranks: TrainerRanks | None = None,
) -> TrainingSession:
    """A training session and everything it runs with, built in order; rank 0 starts the readers of the fleet's
    heartbeats and of the exams. Reads the bucket (the trainer's resume, its history, the run before), loads no
    model.

    Args:
        client: Plays the games in request mode (default: a `RolloutClient` of `config.rollout_url`).
        wrap_publisher: Wraps the publisher the publish callback calls (a benchmark's schedule).
        ranks: The trainer's ranks under `torchrun` (default: one).

    Raises:
        delta.KeyFormatError, delta.PrivateFileError: a key's file or variable holds no key, or is not private.
        FileNotFoundError: no file at `config.handover_from_file`.
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    ranks = ranks or TrainerRanks()
    bucket = keys = None
    if ranks.main:
        handover = previous_key(config.handover_from_file)
        bucket = delta.Bucket.open(config.bucket, writer=True, handover_from=handover)
        keys = trainer_keys(bucket)
    keys = ranks.broadcast(keys)  # what the other ranks resume is what rank 0's key signed
    bucket = bucket or delta.Bucket.open(config.bucket, trust=keys.trust(config.bucket))
    fleet = None
    if config.fleet:
        fleet = FleetRun(config, FleetBucket(bucket, config.rollout_token, handovers=keys.handovers), ranks=ranks.world)
        fleet.read_previous()
    elif client is None:
        from .rollout_client import RolloutClient

        assert config.rollout_url is not None  # request mode: the config checked it has one
        client = RolloutClient(config.rollout_url, token=config.rollout_token)
    monitor = exams = keeper = None
    if ranks.main:
        monitor = FleetMonitor(fleet.bucket).start() if fleet is not None else None
        exams = ExamWatch(bucket, secret=config.rollout_token).start()
        keeper = HistoryKeeper(bucket)
    return TrainingSession(
        config,
        bucket,
        ranks=ranks,
        fleet=fleet,
        client=client,
        monitor=monitor,
        exams=exams,
        keeper=keeper,
        history=keeper.load() if keeper is not None else None,
        owner_token=owner_token,
        wrap_publisher=wrap_publisher,
    )


def run(args: argparse.Namespace) -> None:
    """Resolve the model, build the session, start training (unless --paused) and serve the API and UI until
    interrupted; a rank other than 0 trains beside rank 0, which serves and decides."""
    from models import resolve_model

    try:
        config = config_from_args(args, resolve_model(args.model))
    except ValueError as e:  # a setting to change before anything loads: one line, no traceback
        raise SystemExit(f"python app.py trainer: {e}") from None
    ranks = TrainerRanks.from_environment()
    try:
        session = build_session(config, owner_token=args.owner_token, ranks=ranks)
    except (delta.DeltaError, OSError) as e:  # a key's file or variable (no key quoted), or the bucket
        raise SystemExit(f"python app.py trainer: {e}") from None
    if not ranks.main:
        logger.info("trainer rank %d of %d (rank 0 serves the UI)", ranks.rank, ranks.world)
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
    logger.info("trainer on http://%s:%d (bucket %s, %s)", args.host, args.port, args.bucket, games)
    serve(session, args.host, args.port)
