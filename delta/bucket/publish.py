"""Trainer side: publish each new state to a bucket as the next version, off the training path.

    pub = Publisher("s3://bucket/run", PublisherConfig(anchor_every=50))
    for step in training:
        ...
        pub.publish(model.state_dict())   # blocks only for a copy of the tensors
    pub.close()                           # waits for the last version to be committed

`publish` copies the tensors (on their device) into a snapshot; a background thread hashes and encodes it (a delta
against the last version; an anchor on the first version, every `anchor_every` versions and on request), uploads
the files, commits the manifest and collects garbage. At most one snapshot waits: a newer `publish` is written over
it, so at most three copies of the state live on its device. Each version is signed with the trainer's key
(`Bucket.signing_key`) and recorded beside that key before its commit (`Published`); a new key is introduced by a
handover signed with the old one (`Bucket.handover_from`), and takes over only the old key's versions so recorded.

Several ranks: each publishes its own tensors or slices of tensors (`delta.pieces.Slice`, FSDP2's `DTensor`s: no
rank gathers anything); rank 0 signs and commits once every rank's files have landed, and all ranks decide together
whether a step is published or coalesced (one tiny all-reduce on `group`, a gloo group)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .._cores import resolve_workers
from ..codecs import CODECS, DEFAULT_CODEC, Workspace
from ..errors import BucketUnreachableError, DeltaError, PublishError
from ..patch.diff import encode_delta
from ..retry import RetryPolicy
from ..signing import MAX_HANDOVERS, PublicKey, SigningKey, make_handover
from ..storage import Storage
from ..tensors import _device
from ..tensors.hashing import StateDigest, state_digest
from ..tensors.state import State
from . import pieces
from ._ranks import Ranks
from .anchors import DEFAULT_SHARD_BYTES, encode_anchor
from .handle import Bucket
from .manifest import FileRef, Handover, Manifest, VersionEntry, file_ref, version_dir, write_manifest
from .published import Published
from .reader import Reader
from .resume import Resume
from .retention import collect_garbage, retain
from .trust import resign, sign_latest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    """Settings of a `Publisher`.

    Attributes:
        anchor_every: An anchor (full snapshot) every this many versions, besides the first and `publish(anchor=True)`.
        keep_anchors: Anchors kept in the bucket; older versions and their files are deleted.
        max_shard_bytes: Largest anchor shard file (a single larger tensor gets a file of its own).
        codec: Delta codec (`delta.CODECS`).
        retry_delay: Seconds before the first retry of a failed upload, doubling up to `max_retry_delay` (longer where
            a 429 said); refused credentials or a missing bucket stop the publisher at once (`PublishError`).
        max_retry_delay: Longest wait between two retries of a version.
        commit_timeout: Several ranks: seconds rank 0 waits for the other ranks' files, and they for its commit.
        workers: Threads that encode chunks in the background (None: one per core).
        min_interval: Seconds between two commits at least: steps published sooner coalesce into the next version.
            None: the bucket's budget (`Budget.publish_s`). `flush` and `close` do not wait for it.
    """

    anchor_every: int = 50
    keep_anchors: int = 2
    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    codec: str = DEFAULT_CODEC
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    commit_timeout: float = 600.0
    workers: int | None = None
    min_interval: float | None = None

    def __post_init__(self) -> None:
        if self.anchor_every < 1:
            raise ValueError(f"anchor_every must be >= 1 (1 = every version is an anchor), got {self.anchor_every}")
        if self.keep_anchors < 1:
            raise ValueError(f"keep_anchors must be >= 1, got {self.keep_anchors}")
        if self.max_shard_bytes < 1:
            raise ValueError(f"max_shard_bytes must be positive, got {self.max_shard_bytes}")
        if self.codec not in CODECS:
            raise ValueError(f"unknown codec {self.codec!r}; choose one of {sorted(CODECS)}")
        resolve_workers(self.workers)
        if self.min_interval is not None and self.min_interval < 0:
            raise ValueError(f"min_interval must be >= 0 seconds, got {self.min_interval}")
        if not 0 < self.retry_delay <= self.max_retry_delay or self.commit_timeout <= 0:
            raise ValueError(
                "need 0 < retry_delay <= max_retry_delay and commit_timeout > 0, got "
                f"{self.retry_delay}, {self.max_retry_delay}, {self.commit_timeout}"
            )


@dataclass
class _Snapshot:
    tensors: State
    anchor: bool
    ready: bool  # the worker may take it (always, for one rank; by collective decision for several)
    taken_at: float = field(default_factory=time.time)  # when the trainer handed it over (unix time)


@dataclass(frozen=True)
class PublishedVersion:
    """The newest version this publisher committed (or resumed from): its hash (of all ranks' state), kind, the bytes
    written for it and the seconds from the snapshot to the commit."""

    version: int
    state_hash: str
    kind: str
    bytes_written: int
    seconds: float


class Publisher:
    """Publishes states to a bucket as consecutive versions; see the module docstring.

    The constructor reads and sends nothing; `start` (called by the first `publish` or `with`) goes on from the
    bucket's resume (`Bucket.resume`). The next delta's base is that version's state: `base_state` if it hashes right,
    else pulled from the bucket; failing both, the next version is an anchor.

    Args:
        bucket: A `delta.Bucket` (opened as a writer), a `Storage`, or a URL (opened with `options`).
        config: Settings.
        signing_key, handover_from: With a storage or URL: as `Bucket.open`'s.
        base_state: The state of the bucket's latest version, if the caller holds it (saves a download; one rank).
        group: A gloo process group for several ranks (default: the default group when there are several).

    Threads: one daemon worker thread per publisher; `publish`, `flush` and `close` are for one calling thread (with
    several ranks, every rank calls them at the same points).
    """

    def __init__(
        self,
        bucket: Bucket | Storage | str,
        config: PublisherConfig | None = None,
        *,
        signing_key: SigningKey | str | None = None,
        handover_from: SigningKey | str | None = None,
        base_state: Mapping[str, torch.Tensor] | None = None,
        group: Any = None,
        **options: Any,
    ) -> None:
        if not isinstance(bucket, Bucket):
            options.update(writer=True, signing_key=signing_key, handover_from=handover_from)
        elif signing_key is not None or handover_from is not None:
            raise TypeError(
                "a Bucket holds its keys: open it with Bucket.open(url, signing_key=..., handover_from=...)"
            )
        self.bucket = Bucket.of(bucket, **options)
        self.config = config or PublisherConfig()
        min_interval = self.config.min_interval
        self._min_interval = min_interval if min_interval is not None else self.bucket.budget.publish_s
        self.ranks = Ranks.create(group)
        self.session = ""  # names this run's data folders; set at the start, the same on every rank
        self.last: PublishedVersion | None = None
        #: Seconds the last `publish` blocked for its copy, synchronised with the device.
        self.copy_s = 0.0
        self._given_base = base_state
        self._manifest: Manifest | None = None
        self._handover: Handover | None = None
        self._published: Published | None = None  # rank 0: its records of what its key signed
        self._run_id = ""
        self._next_version = 1
        self._last_anchor = 0
        self._base: State | None = None
        self._base_digest: StateDigest | None = None  # hashed with the pieces' keys, once they are known
        self._pending: _Snapshot | None = None
        self._pieces: pieces.PieceRecord | None = None  # what this rank's slices are (set by the first publish)
        self._busy = False
        self._in_flight = False  # a snapshot taken by the background thread and not yet committed
        self._spare: State | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._hurry = False  # `flush` or `close`: the next commit does not wait for `min_interval`
        self._committed_at = float("-inf")  # monotonic time of the last commit
        self._workspace = Workspace()  # the background thread's memory kept from one delta to the next
        self._cond = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="delta-publisher", daemon=True)
        self._started = False

    @property
    def storage(self) -> Storage:
        """The bucket's storage (its `traffic` is what publishing costs)."""
        return self.bucket.storage

    def start(self) -> Publisher:
        """The start-up, once, on every rank: rank 0 finds where it goes on from and commits a key handover; every rank
        learns it and takes the base of its next delta; the worker thread starts.

        Raises:
            BucketUnreachableError, StorageError: the bucket cannot be read (the next call tries again).
            KeyFormatError, PrivateFileError: rank 0's key cannot be read.
        """
        if self._started:
            return self
        resume = None
        if self.ranks.rank == 0:
            self._published = Published.of(self.bucket.url, self.bucket.signing_key.public)
            resume = self._take_over(self.bucket.resume())
        self.session, resume = self.ranks.broadcast((secrets.token_hex(4), resume))
        assert resume is not None  # rank 0's, broadcast
        self._manifest, self._run_id, self._next_version = resume.manifest, resume.run, resume.next_version
        self._last_anchor = max((v.version for v in resume.manifest.anchors()), default=0) if resume.manifest else 0
        self._base = None if resume.past else self._resume_base(resume)  # numbered past a thief's: an anchor
        if resume.entry is not None:
            self.last = PublishedVersion(resume.version, resume.entry.state_hash, resume.entry.kind, 0, 0.0)
        self._started = True
        self._worker.start()
        return self

    def _take_over(self, resume: Resume) -> Resume:
        """Rank 0, handing over from an earlier key: that key's versions that are the trainer's own (`resume`'s, by its
        records) are committed again signed with the new one, with the handover (one manifest write), so readers of
        either key follow."""
        old, key = self.bucket.handover_from, self.bucket.signing_key
        if old is None or old.public == key.public:
            return resume
        self._handover = make_handover(old, key.public)
        manifest = resume.manifest
        if manifest is None or all(v.signer == key.public.text for v in manifest.versions):
            return resume
        handovers = manifest.handovers + (() if self._handover in manifest.handovers else (self._handover,))
        handovers = handovers[-MAX_HANDOVERS:]  # the last ones: readers refuse a manifest of more
        resigned = resign(replace(manifest, handovers=handovers), key)
        assert self._published is not None  # rank 0's
        self._published.add(resigned, resigned.versions)
        taken = write_manifest(self.bucket, resigned)
        logger.warning(
            "%s: versions %d..%d signed again with this trainer's new key %s, handed over from %s",
            self.bucket.url,
            manifest.versions[0].version,
            manifest.versions[-1].version,
            key.public.fingerprint,
            old.public.fingerprint,
        )
        return replace(resume, manifest=taken)

    def _resume_base(self, resume: Resume) -> State | None:
        """This rank's state of the version resumed, or None (the next version is an anchor only): the caller's
        `base_state` if it hashes to the version's, else pulled from the bucket (every file checked)."""
        entry, manifest, base = resume.entry, resume.manifest, None
        given = self._given_base
        if entry is not None and given is not None and self.ranks.world == 1:
            digest = state_digest(given, workers=self.config.workers)
            if digest.hexdigest == entry.state_hash:
                base = {k: v.detach().clone() for k, v in given.items()}
            else:
                logger.warning(
                    "base_state hashes to %s, the bucket's version %d to %s: pulling it from the bucket",
                    digest.hexdigest,
                    entry.version,
                    entry.state_hash,
                )
        if entry is not None and manifest is not None and base is None:
            try:
                full = _pull(self.bucket, manifest, entry.version)
                names = manifest.shards[self.ranks.rank] if manifest.shards and self.ranks.world > 1 else sorted(full)
                if manifest.shards is not None and len(manifest.shards) != self.ranks.world:
                    names = []
                base = {n: full[n] for n in names} or None
            except (DeltaError, OSError) as e:
                logger.warning(
                    "cannot pull version %d from %s (%s): the next version will be an anchor only",
                    entry.version,
                    self.bucket.url,
                    e,
                )
        return base if self.ranks.all(base is not None) else None

    @property
    def public_key(self) -> PublicKey | None:
        """The public key readers check this publisher's versions with (None on ranks other than 0, which sign
        nothing): what to give them, such as ``DELTA_TRUSTED_KEY=<its .text>``."""
        return self.bucket.signing_key.public if self.ranks.rank == 0 else None

    # -- the trainer's side ----------------------------------------------------------------------------

    def publish(self, state: Mapping[str, Any], *, anchor: bool = False) -> None:
        """Take a snapshot of `state` for publishing as the next version and return once it is copied (`copy_s`);
        `state` may change from then on. A snapshot already waiting is replaced (keeping its anchor request).

        Args:
            state: This rank's tensors, `Slice`s or `DTensor`s; the same names, shapes and dtypes every call.
            anchor: Publish a full snapshot with this version.

        Raises:
            PublishError: the background thread stopped on an error.
            ValueError: a slice does not fit its tensor, or the slices differ from the first call's.
        """
        self.start()
        self._raise_if_failed()
        start = time.perf_counter()
        state, record = pieces.flatten(state)
        if self._pieces is None:
            self._pieces = record
            self._check_base(state)
        elif record != self._pieces:
            raise ValueError("the slices of this publish differ from the first one's; start a new Publisher")
        with self._cond:
            busy = self._busy or (self._pending is not None and self._pending.ready)
            # A snapshot still waiting is overwritten in place (taken back so that the worker cannot start on
            # it meanwhile): at most three copies live on the state's device, published, publishing, waiting.
            waiting, self._pending = self._pending, None
            buffers: dict[str, torch.Tensor] | None
            if waiting is not None:
                buffers, anchor = waiting.tensors, anchor or waiting.anchor
            else:
                buffers, self._spare = self._spare, None
        busy = self.ranks.any(busy)
        snapshot = _copy_into(buffers, state)
        _device.synchronize(snapshot.values())  # a GPU copy is asynchronous: `state` may change once this returns
        self.copy_s = time.perf_counter() - start
        with self._cond:
            self._pending = _Snapshot(snapshot, anchor, ready=self.ranks.world == 1 or not busy)
            self._cond.notify_all()

    @property
    def state_version(self) -> int:
        """The version the state handed in last has in the bucket's numbering: the last committed, plus one for a
        snapshot uploading, plus one for one waiting. Read together, and changing nothing (unlike
        `flush(timeout=0)`)."""
        with self._cond:
            last = self.last.version if self.last is not None else 0
            return last + self._in_flight + (self._pending is not None)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last snapshot taken is committed; True if it was within `timeout` seconds.

        Raises:
            PublishError: the background thread stopped on an error.
        """
        if not self._started:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._pending is not None:
                self._pending.ready = True  # several ranks: every rank holds the same waiting step
                self._hurry = True
            self._cond.notify_all()
            while (self._pending is not None or self._busy) and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        self._raise_if_failed()
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the background thread, within `timeout` seconds in all (None: no bound). True if all
        was committed. Past `timeout` the thread (a daemon) is left running."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            done = self.flush(timeout)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._started:
                self._worker.join(None if end is None else max(0.0, end - time.monotonic()))
        return done

    def __enter__(self) -> Publisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise PublishError(f"publishing to {self.bucket.url} stopped: {self._error}") from self._error

    def _check_base(self, state: Mapping[str, torch.Tensor]) -> None:
        """First publish (every rank): keep the resumed base only if every rank's tensors and slices are laid
        out as in the bucket's latest version; otherwise the next version is an anchor only (a new chain)."""
        base, manifest = self._base, self._manifest or Manifest(0)
        same = (
            base is not None
            and base.keys() == state.keys()
            and all(base[n].shape == t.shape and base[n].dtype == t.dtype for n, t in state.items())
        )
        if same and self.ranks.world > 1:
            shards, layout = manifest.shards, manifest.pieces or {}
            same = shards is not None and len(shards) == self.ranks.world and set(shards[self.ranks.rank]) == set(state)
            same = same and all(
                layout.get(name) is not None
                and (piece, start, stop) in layout[name].pieces
                and layout[name].shape == tuple(shape)
                and layout[name].dim == dim
                for piece, (name, shape, dim, start, stop) in (self._pieces or {}).items()
            )
        elif same:
            same = manifest.shards is None and not self._pieces
        if not self.ranks.all(same):
            with self._cond:
                self._base = None

    # -- the background side ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending is not None and self._pending.ready and self._due()) and not self._closing:
                    due_in = self._committed_at + self._min_interval - time.monotonic()
                    self._cond.wait(due_in if self._pending is not None and due_in > 0 else None)
                if self._pending is None or not self._pending.ready:
                    return
                snapshot, self._pending, self._busy, self._in_flight = self._pending, None, True, True
                self._hurry = False
            try:
                self._publish_with_retries(snapshot)
            except BaseException as e:  # recorded for the trainer's thread, which raises it
                logger.exception("publisher on %s stopped", self.bucket.url)
                with self._cond:
                    self._error = e
                    self._busy = self._in_flight = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._committed_at = time.monotonic()
                self._cond.notify_all()

    def _due(self) -> bool:
        """Whether the waiting snapshot may be committed now (`min_interval`, with one rank; `flush` hurries it)."""
        return self._hurry or self.ranks.world > 1 or time.monotonic() >= self._committed_at + self._min_interval

    def _publish_with_retries(self, snapshot: _Snapshot) -> None:
        policy = RetryPolicy(None, self.config.retry_delay, self.config.max_retry_delay)
        failures = 0
        while True:
            try:
                self._publish_one(snapshot)
                return
            except BucketUnreachableError as e:  # a rate limit too: waited out until the time the server named
                failures += 1
                delay = policy.delay_after(e, failures)
                logger.warning("version %d not published (%s); retrying in %.1f s", self._next_version, e, delay)
            with self._cond:
                self._cond.wait_for(lambda: self._closing, delay)
                if self._closing:
                    raise PublishError(
                        f"closed while the bucket was unreachable; version {self._next_version} was not published"
                    )
                newer = self._pending if self.ranks.world == 1 else None
                if newer is not None:  # coalesce: retry with the newest state instead
                    self._pending, self._spare = None, snapshot.tensors
                    snapshot = _Snapshot(newer.tensors, newer.anchor or snapshot.anchor, True, newer.taken_at)

    def _publish_one(self, snapshot: _Snapshot) -> None:
        """Write and commit `snapshot` as the next version: a delta against the last one (hashed by its changes
        alone, where the state lives), an anchor (copied to the host) when due."""
        start = time.monotonic()
        version, rank = self._next_version, self.ranks.rank
        keys = pieces.hash_keys(snapshot.tensors, self._pieces or {})
        if self._base is not None and self._base_digest is None:  # resumed: hashed once, with the pieces' keys
            self._base_digest = state_digest(self._base, keys, self.config.workers)
        anchor = (
            snapshot.anchor
            or self._base is None
            or self._last_anchor == 0
            or version - self._last_anchor >= self.config.anchor_every
        )
        folder = version_dir(version, self.session)
        delta_refs: list[FileRef] = []
        anchor_refs: list[FileRef] = []
        if self._base is not None:
            data, digest = encode_delta(
                self._base,
                snapshot.tensors,
                codec=self.config.codec,
                version=version,
                base_version=version - 1,
                old_digest=self._base_digest,
                workers=self.config.workers,
                workspace=self._workspace,
            )
            delta_refs.append(self._write(f"{folder}delta-r{rank:05d}.safetensors", data))
        else:
            digest = state_digest(snapshot.tensors, keys, self.config.workers)
        if anchor:
            shards = encode_anchor(
                snapshot.tensors,
                version=version,
                state_hash=digest.hexdigest,
                max_shard_bytes=self.config.max_shard_bytes,
            )
            for i, data in enumerate(shards):
                anchor_refs.append(
                    self._write(f"{folder}anchor-r{rank:05d}-{i:05d}-of-{len(shards):05d}.safetensors", data)
                )
        record = {
            "rank": rank,
            "names": sorted(snapshot.tensors),
            "tensors": digest.to_json(),
            "delta": delta_refs,
            "anchor": anchor_refs,
            "pieces": {p: [n, list(shape), d, a, b] for p, (n, shape, d, a, b) in (self._pieces or {}).items()},
        }
        if rank == 0:
            others = self.ranks.collect(self.bucket, folder, self.config.commit_timeout)
            manifest = self._commit(version, [record, *others], snapshot.taken_at)
        else:
            self.ranks.submit(self.bucket, folder, record)
            manifest = self.ranks.wait_commit(self.bucket, version, folder, self.config.commit_timeout)
        written = sum(f.size for f in delta_refs + anchor_refs)
        if rank == 0:
            written += len(manifest.to_json())
        self._manifest = manifest
        # The snapshot becomes the base of the next delta; the old base's memory is reused.
        with self._cond:
            self._spare = self._base
        self._base, self._base_digest = snapshot.tensors, digest
        self._next_version = version + 1
        if anchor:
            self._last_anchor = version
        committed = manifest.get(version)
        assert committed is not None  # the manifest just committed lists it
        published = PublishedVersion(
            version, committed.state_hash, "anchor" if anchor else "delta", written, time.monotonic() - start
        )
        with self._cond:  # `state_version` reads `last`, the upload and the queue together
            self.last = published
            self._in_flight = False

    def _write(self, path: str, data: bytes) -> FileRef:
        self.bucket.write(path, data)
        return file_ref(path, data, self.ranks.rank)

    def _commit(self, version: int, records: list[dict], taken_at: float) -> Manifest:
        """Rank 0: commit `version` made of every rank's record, then apply retention and collect garbage."""
        records = sorted(records, key=lambda r: r["rank"])
        digest = StateDigest({})
        for r in records:
            part = StateDigest.from_json(r["tensors"])
            if part.names & digest.names:
                raise PublishError(
                    f"rank {r['rank']} publishes tensors another rank publishes too: "
                    f"{sorted(part.names & digest.names)[:3]}"
                )
            digest = digest.merged(part)
        delta = tuple(f for r in records for f in r["delta"])
        anchor = tuple(f for r in records for f in r["anchor"])
        if any(not r["delta"] for r in records):
            delta = ()
        if any(not r["anchor"] for r in records):
            anchor = ()
        prev = self._manifest.latest if self._manifest else None
        entry = VersionEntry(
            version=version,
            kind="anchor" if anchor else "delta",
            base_version=version - 1 if delta else None,
            base_hash=prev.state_hash if delta and prev else None,
            state_hash=digest.hexdigest,
            delta=delta,
            anchor=anchor,
            published_at=taken_at,
        )
        shards = tuple(tuple(r["names"]) for r in records) if len(records) > 1 else None
        layout = pieces.layout_of([r["pieces"] for r in records])
        pieces.check_layout(layout, shards)  # a version whose slices do not tile its tensors is never committed
        current = self._manifest or Manifest(0)
        if self._handover is not None and self._handover not in current.handovers:
            current = replace(current, handovers=(current.handovers + (self._handover,))[-MAX_HANDOVERS:])
        signed = retain(
            sign_latest(current.with_version(entry, shards, layout), self.bucket.signing_key, self._run_id),
            self.config.keep_anchors,
        )
        if self._published is not None:  # before the commit: a version committed is always in the records
            self._published.add(signed, signed.versions[-1:])
        listed = self.bucket.list()  # one listing to number the commit and collect garbage by
        manifest = write_manifest(self.bucket, signed, listed)
        collect_garbage(self.bucket, manifest, listed)
        return manifest


def _copy_into(buffers: State | None, state: Mapping[str, torch.Tensor]) -> State:
    """A copy of `state`, reusing `buffers` (an older snapshot of the same layout) when possible."""
    if (
        buffers is not None
        and buffers.keys() == state.keys()
        and all(
            b.shape == t.shape and b.dtype == t.dtype and b.device == t.device
            for b, t in ((buffers[k], state[k]) for k in state)
        )
    ):
        for k, t in state.items():
            buffers[k].copy_(t.detach())
        return buffers
    return {k: t.detach().clone(memory_format=torch.contiguous_format) for k, t in state.items()}


def _pull(files: Bucket, manifest: Manifest, version: int) -> State:
    """The state of `version` read from the bucket (the trainer's own, checked by hash, not signature)."""
    reader = Reader(files)
    try:
        reader.catch_up(manifest, version)
    finally:
        reader.close()
    assert reader.flat_state is not None  # caught up
    return reader.flat_state
