"""A trainer's own records of what it signed: the versions a rotation away from a stolen key may take over.

A thief with the trainer's key signs versions the bucket cannot tell from the trainer's. So the publisher that signs
a version keeps the digest of what it signed (`Manifest.signed_bytes`) in an owner-only file beside its key, per
bucket and key (`Published.of`), before it commits it; a trainer handing over from that key takes as its own only the
versions its records list (`trust.own_versions`): it signs those alone again, resumes from the last of them, and
numbers its next version past the others. Pruned to what the committed manifest still lists; a local file written at
each commit, no request to the bucket. Without the file (another machine, a cache not kept) no version of the old key
can be shown to be the trainer's, and none is taken over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..private import read_private, write_private
from ..signing import PublicKey, bucket_file
from .manifest import Manifest, VersionEntry

logger = logging.getLogger(__name__)

#: Digests kept at most, the newest versions' (a manifest lists far fewer: its versions since its oldest anchor kept).
MAX_KEPT = 4096


def digest(manifest: Manifest, entry: VersionEntry) -> str:
    """What a record keeps of `entry` as `manifest` lists it: the SHA-256 of what its signature covers."""
    return hashlib.sha256(manifest.signed_bytes(entry)).hexdigest()


class Published:
    """The versions `key` signed for one bucket, by its signer's own records (`path`: the owner-only file; None: this
    process alone). Thread-safe."""

    def __init__(self, key: PublicKey, path: Path | None = None) -> None:
        self.key = key
        self.path = path
        self._signed: dict[str, int] | None = None  # digest -> version, the newest last
        self._lock = threading.Lock()
        self._unwritable = False  # said once

    @classmethod
    def of(cls, bucket: str, key: PublicKey, environ: Mapping[str, str] | None = None) -> Published:
        """The records of what `key` signed for `bucket` (its storage URL, as its key is kept), beside the keys."""
        return cls(key, bucket_file("keys", f"{bucket}\n{key.text}", ".published.json", environ))

    def lists(self, manifest: Manifest, entry: VersionEntry) -> bool:
        """Whether the records show that this key's signer signed `entry` of `manifest`, exactly as it is there."""
        with self._lock:
            return digest(manifest, entry) in self._now()

    def add(self, manifest: Manifest, entries: Iterable[VersionEntry]) -> None:
        """Record `entries` of `manifest`, signed and about to be committed, and forget the versions before its first.
        A file that cannot be written is said once: a rotation away from this key then takes over fewer versions."""
        with self._lock:
            signed = self._now()
            for entry in entries:
                signed.pop(key := digest(manifest, entry), None)
                signed[key] = entry.version
            first = manifest.versions[0].version if manifest.versions else 0
            kept = [(key, version) for key, version in signed.items() if version >= first][-MAX_KEPT:]
            self._signed = dict(kept)
            if self.path is None:
                return
            body = {"key": self.key.text, "signed": [[version, key] for key, version in kept]}
            try:
                write_private(self.path, json.dumps(body).encode())
            except OSError as e:
                if not self._unwritable:
                    logger.warning(
                        "%s cannot be written (%s): a rotation away from key %s will not take over the versions it "
                        "signs from now on",
                        self.path,
                        e,
                        self.key.fingerprint,
                    )
                self._unwritable = True

    def _now(self) -> dict[str, int]:
        """The digests kept (`_lock` held), read from the file at the first call."""
        if self._signed is None:
            self._signed = self._read()
        return self._signed

    def _read(self) -> dict[str, int]:
        """The digests the file keeps ({} for none, or one that cannot be read or holds something else: said, never a
        reason to stop)."""
        try:
            data = read_private(self.path) if self.path is not None else None
            if data is None:
                return {}
            body = json.loads(data)
            if body["key"] != self.key.text:
                raise ValueError(f"the records of another key, {body['key']}")
            return {str(key): int(version) for version, key in body["signed"]}
        except (OSError, ValueError, KeyError, TypeError) as e:  # none taken over: the safe side
            logger.warning("%s does not hold what key %s signed (%s): kept anew", self.path, self.key.fingerprint, e)
            return {}
