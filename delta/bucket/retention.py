"""Retention: drop old versions from the manifest and delete the files nothing references.

Keeping the newest K anchors keeps every version from the oldest of them on: those are the versions a
reader can still reach (load a kept anchor, replay the deltas after it). Older versions leave the
next manifest; their files, files of crashed publish attempts and old manifests are then deleted.

Deleting is not atomic and races with readers: a reader that read an older manifest may find a
file gone; it treats that like any bad file (reads the manifest again, goes through an anchor).
Never run `collect_garbage` beside a publisher of another process: it only spares unreferenced
files of versions above the newest committed one (a publish in progress), nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ..storage import StoredFile
from ._files import Files
from .manifest import VERSIONS_DIR, Manifest, manifest_commits, version_of_path, write_manifest

logger = logging.getLogger(__name__)

#: Manifests kept besides the newest, so that a reader who listed just before a commit still finds its file.
KEEP_OLD_MANIFESTS = 2
#: Older manifests are deleted once this many have gathered, in one request (not one per commit: each request counts
#: against a Hub account's quota).
OLD_MANIFESTS_BATCH = 8


@dataclass(frozen=True)
class GcReport:
    """What `gc` did.

    Attributes:
        manifest: The manifest in force afterwards.
        dropped_versions: Versions removed from the manifest.
        deleted: Paths deleted.
    """

    manifest: Manifest
    dropped_versions: tuple[int, ...]
    deleted: tuple[str, ...]


def retain(manifest: Manifest, keep_anchors: int) -> Manifest:
    """`manifest` without the versions older than its newest `keep_anchors` anchors (same commit number)."""
    if keep_anchors < 1:
        raise ValueError(f"keep_anchors must be at least 1 (the newest anchor is needed to join), got {keep_anchors}")
    anchors = manifest.anchors()
    if len(anchors) <= keep_anchors:
        return manifest
    oldest = anchors[-keep_anchors].version
    return replace(manifest, versions=tuple(v for v in manifest.versions if v.version >= oldest))


def collect_garbage(bucket: Files, manifest: Manifest, listed: list[StoredFile] | None = None) -> list[str]:
    """Delete what `manifest` (the newest, already committed) does not need.

    Deletes data files under `versions/` that it does not reference, of versions up to its latest
    (newer ones may belong to a publish in progress), and manifests older than the newest
    `KEEP_OLD_MANIFESTS + 1` (those once `OLD_MANIFESTS_BATCH` have gathered, or with data files). Returns the deleted
    paths.

    Args:
        listed: The bucket's files as listed just before `manifest` was committed (`write_manifest`'s listing, saving
            one); None: the bucket is listed here.
    """
    latest = manifest.latest.version if manifest.latest else 0
    keep = manifest.referenced()
    files = bucket.list() if listed is None else [*listed, StoredFile(manifest.path, 0)]
    doomed = [
        f.path
        for f in files
        if f.path.startswith(VERSIONS_DIR) and f.path not in keep and (version_of_path(f.path) or 0) <= latest
    ]
    old = [path for commit, path in manifest_commits(files)[KEEP_OLD_MANIFESTS + 1 :] if commit < manifest.commit]
    if doomed or len(old) >= OLD_MANIFESTS_BATCH:
        doomed += old
    bucket.delete(doomed)
    if doomed:
        logger.info("gc: deleted %d files from %s", len(doomed), bucket.url)
    return doomed


def gc(files: Files, manifest: Manifest, keep_anchors: int) -> GcReport:
    """Commit `manifest` retained to `keep_anchors` anchors (if that drops anything), then collect garbage.

    The manifest goes first, so a crash between the two steps leaves only unreferenced files.
    """
    kept = retain(manifest, keep_anchors)
    dropped = tuple(v.version for v in manifest.versions if kept.get(v.version) is None)
    if dropped:
        kept = write_manifest(files, replace(kept, commit=kept.commit + 1))
    return GcReport(kept, dropped, tuple(collect_garbage(files, kept)))
