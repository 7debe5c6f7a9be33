"""Buckets written by two real trainer ranks, and their manifests forged as someone with write access would.

`ranked_bucket` runs `tests._rank_child` as two gloo ranks (versions 1-3 of `tests._trainer.trajectory(6)`):
`names` (each rank publishes half of the tensors) or `split` (every tensor cut into one piece per rank, the
manifest's `pieces`). `forge` replaces the newest manifest with an edited copy: the real version 3 leaves the
bucket (its manifest is removed), so a reader that refuses the forgery falls back to versions 1-2 and its
newest good version is 2.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from delta import Bucket
from delta import DeltaFormatError, Manifest
from delta.bucket.manifest import manifest_commits, manifest_path

from ._signed import signed
from ._trainer import trajectory

#: The states the two ranks publish: version v is STATES[v].
STATES = trajectory(6)


def ranked_bucket(folder: Path, mode: str) -> Path:
    """A bucket with versions 1-3 written by two ranks in `mode` ("names" or "split")."""
    from .test_publish import _ok, _run_ranks

    _ok(_run_ranks(folder, mode, "first"))
    return folder


def manifest_body(bucket: Path) -> dict:
    """The newest manifest of `bucket`, as JSON."""
    storage = Bucket.open(bucket)
    return json.loads(storage.read(manifest_commits(storage)[0][1]))


#: A string value `forge` writes as raw JSON text: RAW + "1e400" becomes the number 1e400, which `json.dumps`
#: cannot write.
RAW = "@raw@"


def forge(source: Path, target: Path, edit: Callable[[dict], object] | None = None) -> Path:
    """A copy of `source` whose newest manifest is replaced by `edit`ed JSON (string values RAW + text become that
    text), committed as the next commit; the real newest manifest is removed, so the good versions left are 1-2. An
    edit that still parses is signed with the trainer's key (`tests._signed`): the checks behind the signature are
    what it tests."""
    shutil.copytree(source, target)
    storage = Bucket.open(target)
    commit, path = manifest_commits(storage)[0]
    body = json.loads(storage.read(path))
    storage.delete([path])
    body["commit"] = commit + 1
    if edit is not None:
        edit(body)
    text = re.sub(f'"{RAW}([^"]*)"', lambda m: m.group(1), json.dumps(body))
    try:
        text = signed(storage, Manifest.from_json(text.encode())).to_json().decode()
    except DeltaFormatError:
        pass  # refused as it is, before any signature is looked at
    storage.write(manifest_path(commit + 1), text.encode())
    return target
