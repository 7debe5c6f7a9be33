"""`python -m rollout_space.sidecar`: a stock `vllm serve --enable-lora` follows a LoRA run of this product, in adapter
mode, with the run's own settings.

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 python -m vllm.entrypoints.openai.api_server --model BASE \\
        --enable-lora --max-lora-rank 16 &
    ROLLOUT_TOKEN=... python -m rollout_space.sidecar --bucket BUCKET --vllm-url http://127.0.0.1:8000 \\
        --max-lora-rank 16

`python -m delta follow --lora-alpha` loads a bucket's adapter versions with what its command line says; this
sidecar reads the run's settings from the bucket (``fleet/run.json``, `wire.fleet.RunSettings.lora`) before each
version instead, which `delta` cannot (the library reads no app's files): alpha, rank and targets are the run's,
the versions kept loaded its staleness + 1 (unless `--keep`), and a version is refused in one line (counted in the
status file's ``refused``) when the run trains on another base than the server's model (`--base`, default the folder
the server loaded, `/v1/models`; the sidecar hashes it once at start), when its rank is above `--max-lora-rank`, when
its tensors are not the run's adapter, or when the run publishes full weights (merged or every weight: a server with
the `delta` backend follows those, `python -m delta follow`). The adapter versions and the run's settings are used only
when the trainer's key signed them (`--trusted-key`, env DELTA_TRUSTED_KEY; else the key of the first signed one, kept
per bucket; `--unauthenticated` for an unsigned bucket): a version it did not sign is refused in one line and counted
(``untrusted version``), and settings it did not sign are refused and the last ones it signed kept. The run's
settings are also checked against their HMAC with the run's rollout token (`--rollout-token`, env ROLLOUT_TOKEN);
without it that check is skipped, and the sidecar says so at start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

import settings
from delta import Trust, open_storage
from delta.follow import (
    AdapterFollower,
    AdapterRefusedError,
    AdapterRun,
    add_arguments,
    base_hash_of,
    follow_config,
    run_until_stopped,
)
from delta.integrations.vllm_http import VLLMHTTPClient
from wire.fleet_bucket import FleetBucket
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
    try:
        url = open_storage(args.bucket).url
        trust = Trust.unauthenticated_for(url) if args.unauthenticated else Trust.for_bucket(url, args.trusted_key)
        client.wait_ready(config.ready_timeout)
        base_hash = server_base_hash(client, args.base)
        run = run_adapter(FleetBucket(args.bucket, secret=args.rollout_token, trust=trust), args.keep)
        follower = AdapterFollower(
            config, run, base_hash=base_hash, max_rank=args.max_lora_rank, client=client, trust=trust
        )
    except (OSError, ValueError) as e:  # PrivateFileError is an OSError, KeyFormatError a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    return run_until_stopped(follower, args.until)


if __name__ == "__main__":
    sys.exit(main())
