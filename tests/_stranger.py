"""Someone with write access to a bucket and none of the trainer's files: `python -m tests._stranger BUCKET`.

Run as a process of its own with its own HOME and XDG_CACHE_HOME (`publish_as_stranger`), it publishes an all-zero
state of the bucket's layout as the next version with an ordinary `delta.Publisher` (a key of its own, made in its
own cache, or the one given: a thief's copy of the trainer's). `copy_signature` is the other forgery: the bucket's newest manifest edited so that the stranger's
version carries the trainer's signature, signer and run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from delta import Bucket
from delta import Publisher, SigningKey, Subscriber, Trust, VersionEntry, read_manifest
from delta.bucket.manifest import MANIFEST_DIR

REPO = Path(__file__).resolve().parent.parent


def publish_as_stranger(bucket: str, home: Path, key: SigningKey | None = None) -> int:
    """Run this module in a process whose home and cache are `home`; returns the version it published. `key`: the
    key it signs with (a thief's copy of the trainer's); None: one of its own, made in its cache."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("DELTA_SIGNING_KEY", None)
    if key is not None:
        env["DELTA_SIGNING_KEY"] = key.secret_text()
    env.pop("DELTA_TRUSTED_KEY", None)
    done = subprocess.run([sys.executable, "-m", "tests._stranger", bucket], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])


def copy_signature(bucket: str, trainers: VersionEntry) -> int:
    """Give the newest version of the newest manifest the signature, signer and run of `trainers` (the trainer's last
    version), in a new manifest file, as any writer commits; returns that version."""
    storage = Bucket.open(bucket)
    manifest = read_manifest(storage)
    path = f"{MANIFEST_DIR}{manifest.commit + 1:010d}.json"
    body = json.loads(storage.read(manifest.path))
    last = body["versions"][-1]
    last.update(signature=trainers.signature, signer=trainers.signer, run=trainers.run)
    body["commit"] += 1
    storage.write(path, json.dumps(body, sort_keys=True, indent=1).encode())
    return last["version"]


def main(bucket: str) -> None:
    # What any reader can fetch: the newest state, unauthenticated (the stranger trusts nobody's key).
    with Subscriber(bucket, trust=Trust.unauthenticated_for(Bucket.open(bucket).url)) as reader:
        reader.sync()
        zeros = {name: torch.zeros_like(t) for name, t in reader.state.items()}
    with Publisher(bucket) as pub:
        pub.publish(zeros)
        assert pub.flush(timeout=120)
    print(pub.last.version, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
