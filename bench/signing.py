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

from delta import (
    FileRef,
    Manifest,
    Publisher,
    PublisherConfig,
    SigningKey,
    Storage,
    Subscriber,
    Trust,
    VersionEntry,
    open_storage,
)
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


def counted(storage: Storage) -> Counter[str]:
    """Count every call `storage` answers, by method (the instance's methods wrapped)."""
    calls: Counter[str] = Counter()
    for name in ("read", "write", "list", "move", "delete"):
        method = getattr(storage, name)

        def wrapper(*args: object, _name: str = name, _method: Callable = method, **kwargs: object) -> object:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(storage, name, wrapper)
    return calls


def requests(versions: int = 10) -> dict[str, Counter[str]]:
    """Calls to the bucket of a reader that checks signatures and of one that does not, following `versions`."""
    key = SigningKey.generate()
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        state = {"w": torch.zeros(256, 256, dtype=torch.bfloat16)}
        storages = {mode: open_storage(folder) for mode in ("signed", "unauthenticated")}
        calls = {mode: counted(s) for mode, s in storages.items()}
        readers = {
            "signed": Subscriber(storages["signed"], trust=Trust(storages["signed"].url, key.public)),
            "unauthenticated": Subscriber(
                storages["unauthenticated"], trust=Trust(storages["unauthenticated"].url, unauthenticated=True)
            ),
        }
        with Publisher(folder, PublisherConfig(anchor_every=1000), signing_key=key) as pub:
            for v in range(versions):
                state["w"][v, :8] += 1
                pub.publish(state)
                assert pub.flush(timeout=60)
                for reader in readers.values():
                    reader.sync()
        for mode, reader in readers.items():
            assert reader.version == versions
            reader.close()
            out[mode] = calls[mode]
    return out


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
        print(
            f"requests to the bucket following 10 versions, {mode}: {sum(calls.values())} "
            f"({dict(sorted(calls.items()))})"
        )


if __name__ == "__main__":
    main()
