"""What signing and checking versions costs: time per version, and requests to the bucket.

    python -m bench.signing                  # versions of 1, 8 and 64 files, best of 2,000
    python -m bench.signing --repeat 5000

Time: the trainer's `sign_latest` (the canonical bytes of the newest version, then one Ed25519 signature) and a
reader's `Trust.check_version` (the same bytes, one verification) on a manifest of 100 retained versions whose newest
has 1 file (one rank's delta), 8 (eight ranks) or 64 (an anchor's shards), best of --repeat. Requests: a
`Subscriber` that checks signatures and one that follows the same bucket unauthenticated, each following 10
versions, counting every call they make to the bucket (a signature travels in the manifest: no request of its own).

A white-box tool: it calls the trainer's signing step itself (`delta.bucket.trust.sign_latest`), which the public
API runs only inside a `Publisher`.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import torch

from delta import Bucket, FileRef, Manifest, Publisher, PublisherConfig, SigningKey, Subscriber, Trust, VersionEntry
from delta.bucket.trust import sign_latest


def manifest_of(files: int, versions: int = 100) -> Manifest:
    """`versions` versions, the newest with `files` files, laid out as a publisher does (real-sized paths, hashes)."""

    def ref(v: int, i: int) -> FileRef:
        return FileRef(
            f"versions/{v:08d}-1a2b3c4d/delta-r{i:05d}.safetensors",
            1_000_000 + i,
            hashlib.sha256(f"{v}/{i}".encode()).hexdigest(),
            i % 8,
        )

    entries = [
        VersionEntry(
            v,
            "delta",
            v - 1,
            f"sum128:{v - 1:032x}",
            f"sum128:{v:032x}",
            tuple(ref(v, i) for i in range(files if v == versions else 1)),
        )
        for v in range(2, versions + 1)
    ]
    shards = tuple(tuple(f"layers.{r}.w{i}" for i in range(4)) for r in range(8))
    return Manifest(1, tuple(entries), shards)


def best(call: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` calls, in microseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e6 * min(times)


def requests(versions: int = 10) -> dict[str, Counter[str]]:
    """Calls to the bucket of a reader that checks signatures and of one that does not, following `versions` (each
    reader's bucket object counts its own)."""
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as folder:
        state = {"w": torch.zeros(256, 256, dtype=torch.bfloat16)}
        buckets = {
            "signed": Bucket.open(folder, trusted_key=key.public),
            "unauthenticated": Bucket.open(folder, unauthenticated=True),
        }
        readers = {mode: Subscriber(bucket) for mode, bucket in buckets.items()}
        with Publisher(folder, PublisherConfig(anchor_every=1000), signing_key=key) as pub:
            for v in range(versions):
                state["w"][v, :8] += 1
                pub.publish(state)
                assert pub.flush(timeout=60)
                for reader in readers.values():
                    reader.sync()
        for reader in readers.values():
            assert reader.version == versions
            reader.close()
        return {mode: Counter(bucket.traffic.snapshot().total) for mode, bucket in buckets.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.signing", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000, help="calls timed per figure (the best is shown)")
    args = parser.parse_args()
    key = SigningKey.generate()
    run = secrets.token_hex(16)
    print(f"{'files in the version':>20}  {'sign (trainer)':>14}  {'check (reader)':>14}  signed bytes")
    for files in (1, 8, 64):
        manifest = sign_latest(manifest_of(files), key, run)
        trust = Trust("file:///bench", key.public)
        entry = manifest.latest
        assert entry is not None  # the version just signed

        def signing_once(manifest: Manifest = manifest) -> object:
            return sign_latest(manifest, key, run)

        def checking_once(t: Trust = trust, e: VersionEntry = entry, m: Manifest = manifest) -> None:
            t.check_version(e, m, run)

        signing = best(signing_once, args.repeat)
        checking = best(checking_once, args.repeat)
        print(f"{files:>20}  {signing:>11.0f} us  {checking:>11.0f} us  {len(manifest.signed_bytes(entry)):>12,}")
    for mode, calls in requests().items():
        made = dict(sorted((+calls).items()))  # the kinds of call it made
        print(f"requests to the bucket following 10 versions, {mode}: {sum(made.values())} ({made})")


if __name__ == "__main__":
    main()
