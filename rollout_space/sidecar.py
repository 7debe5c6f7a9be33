"""`python -m rollout_space.sidecar`: a stock `vllm serve --enable-lora` follows a LoRA run of this product
(adapter mode) with the run's own settings.

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 python -m vllm.entrypoints.openai.api_server --model BASE \\
        --enable-lora --max-lora-rank 16 &
    ROLLOUT_TOKEN=... python -m rollout_space.sidecar --bucket BUCKET --vllm-url http://127.0.0.1:8000 \\
        --max-lora-rank 16

Where `python -m delta follow --lora-alpha` takes the adapter's settings from its command line, this sidecar reads the
run's settings (``fleet/run.json``) before each version: alpha, rank and targets are the run's, the versions kept its
staleness + 1 (unless `--keep`). A version is refused in one line, and counted, when the run trains on another base
than the server's model (`--base`, default the folder the server loaded), its rank is above `--max-lora-rank`, its
tensors are not the run's adapter, or the run publishes full weights (which `delta follow` follows). Versions and
settings are used only when the trainer's key signed them (`--trusted-key`, as `delta follow`); the settings' HMAC is
checked with the run's rollout token (`--rollout-token`), a check skipped, and said so, without one."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

import delta
import settings
from delta.follow import (
    AdapterFollower,
    AdapterRefusedError,
    AdapterRun,
    FollowStatus,
    add_arguments,
    base_hash_of,
    follow_config,
    run_until_stopped,
)
from delta.integrations.vllm_http import VLLMHTTPClient
from fleet.bucket import FleetBucket
from wire.lora import kept_versions_refusal

logger = logging.getLogger(__name__)


def run_adapter(bucket: FleetBucket, keep: int | None = None) -> Callable[[], AdapterRun]:
    """A function that reads the run's settings from `bucket` and returns the adapter they describe (`keep`, when
    given, instead of the run's staleness + 1).

    The function raises:
        AdapterRefusedError: no run's settings in the bucket, a run that publishes no adapter, or one that asks for more
            versions kept than `wire.lora.MAX_KEPT_VERSIONS`.
        wire.fleet.FleetMessageError: the run's settings are not a valid message (or not signed with the token).
        OSError: the bucket cannot be read.
    """

    def read() -> AdapterRun:
        run = bucket.read_run()
        if run is None:
            raise AdapterRefusedError(
                "the bucket holds no run's settings (fleet/run.json): follow a bucket of adapter "
                "versions without them with `python -m delta follow --lora-alpha A`",
                "no run settings",
            )
        lora = run.lora
        if lora is None or lora.sync != "adapter":
            what = "every weight" if lora is None else "the base with its adapter merged in"
            raise AdapterRefusedError(
                f"the run publishes {what}, not an adapter: follow it with `python -m delta "
                "follow` beside a server with the delta backend",
                "not an adapter run",
            )
        kept = run.max_staleness + 1 if keep is None else keep
        if too_many := kept_versions_refusal(kept):
            raise AdapterRefusedError(too_many, "too many versions")
        return AdapterRun(lora.alpha, keep=kept, r=lora.r, targets=lora.targets, base_hash=lora.base_hash)

    return read


def count_run_refusals(bucket: FleetBucket, status: FollowStatus) -> None:
    """Show in `status` (the status file) the run settings `bucket` refused for their signature, as a rollout server's
    `/status` does: ``refused["untrusted run settings"]``, and the last refusal's reason as `last_error`."""
    if bucket.runs_refused > status.refused.get("untrusted run settings", 0):
        status.refused["untrusted run settings"] = bucket.runs_refused
        status.last_error = bucket.run_refusal


def server_base_hash(client: VLLMHTTPClient, base: str | None) -> str | None:
    """The state hash of the server's base model (`delta.follow.base_hash_of`): of `base`, else of the folder the
    server loaded when it is one on this machine; None (logged) when neither is."""
    folder = base or client.base_model()
    if not os.path.isdir(folder):
        logger.warning(
            "the server's model %s is not a folder on this machine: the run's base is not checked (pass "
            "--base with its folder)",
            folder,
        )
        return None
    return base_hash_of(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout_space.sidecar", description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument(
        "--base",
        default=None,
        help="the server's base model folder, hashed to refuse a run on another base (default: the "
        "folder the server loaded, when it is one on this machine)",
    )
    settings.ROLLOUT_TOKEN.add_to(parser, help="the run's rollout token, which checks the signature of its settings")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not args.rollout_token:
        logger.warning(
            "no rollout token (--rollout-token / ROLLOUT_TOKEN): the run's settings are read without "
            "checking their HMAC"
        )
    config = follow_config(args)
    client = VLLMHTTPClient(config.vllm_url, timeout=config.request_timeout)
    bucket = delta.Bucket.open(args.bucket, trusted_key=args.trusted_key, unauthenticated=args.unauthenticated)
    try:
        bucket.trust  # noqa: B018 - the trainer's key, read before anything starts (one line if it is not one)
        client.wait_ready(config.ready_timeout)
        base_hash = server_base_hash(client, args.base)
        fleet = FleetBucket(bucket, secret=args.rollout_token)
        adapter = run_adapter(fleet, args.keep)

        def run() -> AdapterRun:  # read before each version, once `follower` is made
            try:
                return adapter()
            finally:
                count_run_refusals(fleet, follower.status)

        follower = AdapterFollower(
            config, run, base_hash=base_hash, max_rank=args.max_lora_rank, client=client, bucket=bucket
        )
    except (OSError, ValueError) as e:  # PrivateFileError is an OSError, KeyFormatError a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    return run_until_stopped(follower, args.until)


if __name__ == "__main__":
    sys.exit(main())
