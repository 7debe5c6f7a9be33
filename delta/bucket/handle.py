"""`delta.Bucket`: one bucket as one role of one process holds it, opened once and passed to everything that uses it.

    bucket = delta.Bucket.open("hf://buckets/team/run")      # or a folder, s3://..., or Bucket(your_storage)
    sub = delta.Subscriber(bucket)                             # polls at the Hub's budget: bucket.budget
    fleet = FleetBucket(bucket)                                # the same listing, traffic, 429 hold and trust

It holds the storage and its request counts (`traffic`, with the server's rate limit: a 429 seen by one reader holds
back all), one listing of the whole bucket shared by every poller of the object (`list(prefix, max_age=...)`), files
parsed once while listed unchanged (`parsed`), the budget of the bucket's kind, a writer's signing key or a reader's
trust, and a writer's resume. Two objects of one bucket share nothing; the constructor reads and sends nothing."""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from ..errors import DeltaFormatError, NoPathError
from ..signing import PublicKey, SigningKey, trainer_key
from ..storage import Storage, StoredFile, Traffic, open_storage
from ._listing import SharedListing
from .budget import Budget
from .manifest import Manifest, newest_manifest
from .published import Published
from .reader import Reader
from .resume import Resume, find_resume
from .trust import Trust

T = TypeVar("T")

#: Files whose parse `parsed` keeps (run settings, heartbeats, manifests, exams: a few per server and version).
_MAX_PARSED = 4096


class Bucket:
    """One bucket for one role: see the module docstring.

    Args:
        storage: The bucket's files (`Bucket.open` opens one from a URL).
        budget: How often it is read and written; None: its kind's (`Budget.of`).
        writer: A trainer's bucket: `trust` is its own key's, and `resume` finds its versions.
        signing_key: A writer's key (or its text); None: `delta.signing.trainer_key`'s, read when first asked for.
        handover_from: A writer's previous key, which `signing_key` replaces.
        trust: A reader's trust; None: from `trusted_key` and `unauthenticated` (`Trust.for_bucket`), when first asked.
        trusted_key: The trainer's public key (a key, its text or a file holding it).
        unauthenticated: Follow an unsigned bucket: whoever writes to it decides the weights.
        clock: Monotonic seconds, for the listing's age (a test's own clock).

    Threads: every method may be called from any thread.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        budget: Budget | None = None,
        writer: bool = False,
        signing_key: SigningKey | str | None = None,
        handover_from: SigningKey | str | None = None,
        trust: Trust | None = None,
        trusted_key: str | PublicKey | None = None,
        unauthenticated: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.budget = budget or Budget.of(storage.url)
        self.writer = writer or signing_key is not None
        self._signing_key = SigningKey.parse(signing_key) if isinstance(signing_key, str) else signing_key
        self.handover_from = SigningKey.parse(handover_from) if isinstance(handover_from, str) else handover_from
        self._trust = trust
        self._trusted_key = trusted_key
        self._unauthenticated = unauthenticated
        self._listing = SharedListing(clock)
        self._parsed: dict[str, tuple[StoredFile, Any]] = {}
        self._resume: Resume | None = None
        self._lock = threading.RLock()

    @classmethod
    def open(cls, url: str | os.PathLike[str], **options: Any) -> Bucket:
        """The bucket at `url` (a folder, `file://`, `s3://`, `hf://buckets/...`). `options`: `Bucket`'s own, the rest
        to the storage backend (`token`, `endpoint`, `retry`, ...). Sends nothing."""
        mine = {k: options.pop(k) for k in _OWN if k in options}
        return cls(open_storage(url, **options), **mine)

    @classmethod
    def of(cls, bucket: Bucket | Storage | str, **options: Any) -> Bucket:
        """`bucket` itself, or a `Bucket` of a storage or URL (`options` as `open`'s; none with a `Bucket`)."""
        if isinstance(bucket, Bucket):
            if options:
                raise TypeError(f"options {sorted(options)} are for opening a bucket: pass them to Bucket.open")
            return bucket
        if isinstance(bucket, Storage):
            return cls(bucket, **options)
        return cls.open(bucket, **options)

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"

    @property
    def url(self) -> str:
        """The storage's URL (no credentials): one spelling per bucket."""
        return self.storage.url

    @property
    def traffic(self) -> Traffic:
        """The requests sent to the bucket's server, by class, and its rate limit (`delta.storage.Traffic`)."""
        return self.storage.traffic

    # -- files ------------------------------------------------------------------------------------------

    def read(self, path: str, max_bytes: int | None = None, *, listed: StoredFile | None = None) -> bytes:
        """The file at `path` (`Storage.read`: bounded by `max_bytes`; `listed`: its entry in a listing)."""
        return self.storage.read(path, max_bytes, listed=listed)

    def write(self, path: str, data: bytes) -> StoredFile:
        """Create or replace `path` (`Storage.write`); the shared listing shows it at once."""
        return self.write_many({path: data})[0]

    def write_many(self, files: Mapping[str, bytes]) -> builtins.list[StoredFile]:
        """Write several files in as few requests as the backend allows (`Storage.write_many`: not atomic)."""
        written = self.storage.write_many(files)
        for entry in written:
            self._listing.changed(entry.path, entry)
        return written

    def move(self, source: str, target: str) -> None:
        """Move a file without reading it (`Storage.move`)."""
        self.storage.move(source, target)
        moved = self._listing.entry(source)
        self._listing.changed(source, None)
        self._listing.changed(target, StoredFile(target, moved.size, moved.etag) if moved is not None else None)

    def delete(self, paths: Iterable[str]) -> None:
        """Delete files, skipping missing ones (`Storage.delete`: not atomic)."""
        paths = builtins.list(paths)
        self.storage.delete(paths)
        for path in paths:
            self._listing.changed(path, None)

    def list(self, prefix: str = "", *, max_age: float = 0.0) -> builtins.list[StoredFile]:
        """The files whose path starts with `prefix`, sorted by path. `max_age` (a poller's interval): the answer may
        come from a listing of the whole bucket made through this object at most that long ago, shared by all its
        pollers, with its own changes since; 0: listed now."""
        if max_age > 0 or not prefix:
            files = self._listing.files(max_age, self.storage.list)
            return sorted((f for f in files if f.path.startswith(prefix)), key=lambda f: f.path)
        return self.storage.list(prefix)

    def listed(self, path: str) -> StoredFile | None:
        """`path`'s entry in the shared listing (None: not in it, or none kept). Asks nothing; may be out of date."""
        return self._listing.entry(path)

    def parsed(self, listed: StoredFile, read: Callable[[], T], refusals: tuple[type[Exception], ...] = ()) -> T:
        """What `read()` gives for the file `listed`, read once: neither it nor a refusal (one of `refusals`, raised
        again) is read again while listed with the same size and etag. A folder names no content: its files are read
        again, refusals too (a trainer's new run settings may have the very size of the refused ones)."""
        with self._lock:
            kept = self._parsed.get(listed.path)
        if kept is not None and kept[0] == listed and listed.etag is not None:
            result = kept[1]
        else:
            try:
                result = read()
            except refusals as refused:
                result = refused
            with self._lock:
                self._parsed.pop(listed.path, None)
                if len(self._parsed) >= _MAX_PARSED:
                    self._parsed.pop(next(iter(self._parsed)))
                self._parsed[listed.path] = (listed, result)
        if isinstance(result, Exception):
            raise result
        return result

    # -- keys, trust, resume -------------------------------------------------------------------------------

    @property
    def signing_key(self) -> SigningKey:
        """A writer's key: the one given, else `trainer_key(url)`, read at the first call.

        Raises:
            KeyFormatError, PrivateFileError: the variable or the kept file holds no key, or is not a private file.
        """
        with self._lock:
            if self._signing_key is None:
                self._signing_key = trainer_key(self.url)
            return self._signing_key

    @property
    def trust(self) -> Trust:
        """Whose versions and run settings are taken from this bucket, one `Trust` for every reader of the object: the
        one given; a writer's own key (and the one it hands over from); else `Trust.for_bucket`'s. Made at the first
        call.

        Raises:
            KeyFormatError, PrivateFileError: a key given or kept is not one, or its file is not a private file.
        """
        with self._lock:
            if self._trust is None:
                if self.writer:
                    earlier = [self.handover_from.public] if self.handover_from is not None else []
                    self._trust = Trust.own(self.url, self.signing_key.public, earlier)
                elif self._unauthenticated:
                    self._trust = Trust.unauthenticated_for(self.url)
                else:
                    self._trust = Trust.for_bucket(self.url, self._trusted_key, identity=self.storage.identity)
            return self._trust

    def resume(self) -> Resume:
        """A writer's resume: its last own version and the manifest up to it (`resume.find_resume`), found at the first
        call and kept, so that the publisher, the weights and the history go on from the same version.

        Raises:
            BucketUnreachableError, StorageError: from the bucket (nothing kept: the next call tries again).
        """
        with self._lock:
            if self._resume is None:
                old = self.handover_from
                earlier = [Published.of(self.url, old.public)] if old is not None else []
                self._resume = find_resume(self, self.signing_key.public, earlier)
            return self._resume

    def read_version(self, manifest: Manifest, version: int) -> dict[str, torch.Tensor]:
        """`version` as `manifest` lists it, read whole, every file and signature checked with this bucket's trust: a
        trainer reads its resume's version from its own manifest (`resume().manifest`), never from a newer one that
        may list another entry under the same number (a stolen key's).

        Raises:
            delta.DeltaError, OSError: the bucket cannot be read, or the version is refused.
        """
        reader = Reader(self, trust=self.trust)
        try:
            reader.catch_up(manifest, version)
        finally:
            reader.close()
        if reader.version != version or reader.state is None:
            raise NoPathError(f"{self.url} holds no version {version} to read in that manifest", target=version)
        return dict(reader.state)


def read_manifest(
    bucket: Bucket | Storage | str,
    *,
    max_age: float = 0.0,
    on_refused: Callable[[DeltaFormatError], None] | None = None,
    **options: Any,
) -> Manifest | None:
    """The newest manifest of `bucket` (a `Bucket`, a storage, or a URL opened with `options`) that parses, or None for
    a bucket with no version yet (`newest_manifest`; `max_age` as `Bucket.list`'s).

    Raises:
        BucketUnreachableError, StorageError: from the bucket.
        DeltaFormatError: manifests exist but none parses.
    """
    return newest_manifest(Bucket.of(bucket, **options), on_refused, max_age)


_OWN = ("budget", "writer", "signing_key", "handover_from", "trust", "trusted_key", "unauthenticated", "clock")
