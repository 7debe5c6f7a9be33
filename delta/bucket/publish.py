"""Trainer side: publish each new state to a bucket as the next version, off the training path.

    pub = Publisher("s3://bucket/run", PublisherConfig(anchor_every=50))
    for step in training:
        ...
        pub.publish(model.state_dict())   # blocks only for a copy of the tensors
    pub.close()                           # waits for the last version to be committed

`publish` copies the tensors (on their device) into a snapshot and returns once the copy is done. A
background thread hashes and encodes the snapshot (a delta against the last published version; an
anchor on the first version, every `anchor_every` versions and on request), uploads the files, commits
the manifest and collects garbage. At most one snapshot waits: if uploads fall behind, a newer
`publish` is written over the waiting one, so the next delta simply spans more training steps, and at
most three copies of the state live on its device (published, publishing, waiting).

A state on a GPU is diffed and hashed there (`delta.codecs._device_scan`): the state hash of each version
moves by the changed elements alone, and only they cross to the host; an anchor copies the state to the
host once. Not yet run on a GPU: tested with CPU tensors through the same code (`DELTA_DEVICE_PATH=1`).

Each version is signed with the trainer's Ed25519 key (`delta.bucket.trust`), which readers check before they apply
it: the key given, else ``DELTA_SIGNING_KEY``, else one made at the first start on the bucket and kept owner-only in
the user's cache (`delta.signing.trainer_key`), so a restarted trainer signs with the same key. A new key is
introduced to readers by a handover signed with the old one (`handover_from`): on start, the publisher signs the
versions of the old key again with the new one and commits them with the handover, so that readers that trust the old
key follow the new one, and readers given the new key alone can load them. A publisher that finds versions it did not
sign at the end of the bucket (a stranger's) says so and goes on from its own last version; it keeps the run id of its
versions across restarts.

Several ranks: each rank calls `publish` with its own tensors (disjoint names) at the same steps, or with slices of
tensors (`delta.pieces.Slice`, or an FSDP2 state dict's `DTensor`s, whose local shards are published as they are: no
rank gathers anything; `delta.pieces.split` cuts a state every rank holds whole into shares). Rank 0 signs and
commits the manifest once every rank's files have landed (only it needs the key). Whether a step is published or
coalesced is decided by all ranks together (one tiny all-reduce per `publish` on `group`, which must be a gloo
group), so all ranks publish the same steps.
"""

from __future__ import annotations

import itertools
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
from ..signing import PublicKey, SigningKey, trainer_key
from ..storage import Storage, open_storage
from ..tensors import _device
from ..tensors.hashing import SCHEME, SumDigest, scheme_of, state_digest
from ..tensors.state import State
from . import pieces
from ._ranks import Ranks
from .anchors import DEFAULT_SHARD_BYTES, encode_anchor
from .manifest import (
    FileRef,
    Handover,
    Manifest,
    VersionEntry,
    file_ref,
    manifests_after,
    read_manifest,
    version_dir,
    write_manifest,
)
from .reader import Reader
from .retention import collect_garbage, retain
from .trust import make_handover, own_versions, resign, sign_latest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    """Settings of a `Publisher`.

    Attributes:
        anchor_every: An anchor (full snapshot) every this many versions, besides the first version
            and `publish(..., anchor=True)`. Readers that fall behind or join late load the newest anchor.
        keep_anchors: Anchors kept in the bucket; older versions and their files are deleted.
        max_shard_bytes: Largest anchor shard file (a single larger tensor gets a file of its own).
        codec: Delta codec (`delta.CODECS`).
        retry_delay: Seconds before the first retry of a version whose upload failed (the bucket was
            unreachable after the storage's own retries, or did not apply every file of a batch); doubles up to
            `max_retry_delay`, with jitter (`delta.retry.RetryPolicy`), and waits longer where the bucket said to
            (a 429's time). Retried until it succeeds or `close` gives up. Refused credentials or a missing bucket
            the publisher may not create stop it at once (`PublishError` says which).
        max_retry_delay: Longest wait between two retries of a version.
        commit_timeout: Several ranks: seconds rank 0 waits for the other ranks' files, and they for
            its commit, before the publisher stops with `PublishError`.
        workers: Threads that encode chunks in the background (None: one per core; fewer leaves
            cores to training).
        min_interval: Seconds between two commits at least (one rank only): steps published sooner wait, and the
            newest of them goes out once the interval has passed (they coalesce into one delta). For a bucket whose
            requests are counted (a Hub account's quota, `wire.budget`): a trainer stepping every second would
            otherwise spend several requests a second. `flush` and `close` do not wait for it. 0: no wait.
    """

    anchor_every: int = 50
    keep_anchors: int = 2
    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    codec: str = DEFAULT_CODEC
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    commit_timeout: float = 600.0
    workers: int | None = None
    min_interval: float = 0.0

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
        if self.min_interval < 0:
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
    """The newest version this publisher committed (or resumed from).

    Attributes:
        version: Model version.
        state_hash: Hash of the whole state (all ranks).
        kind: "anchor" or "delta".
        bytes_written: Data and manifest bytes written for it.
        seconds: From taking the snapshot to the commit.
    """

    version: int
    state_hash: str
    kind: str
    bytes_written: int
    seconds: float


class Publisher:
    """Publishes states to a bucket as consecutive versions; see the module docstring.

    On start it reads the bucket's newest manifest: numbering continues after the latest version this trainer
    signed, and the base of the next delta is that version's state — `base_state` if it hashes to the
    manifest's state hash, else pulled from the bucket (verified against the hash); if neither is
    possible the next version is an anchor only. With none of its own in the bucket, numbering continues after the
    bucket's latest version, and the next version is an anchor of a new run.

    Args:
        bucket: URL for `open_storage`, or an open `Storage`.
        config: Settings.
        signing_key: The trainer's key (or its text, ``ed25519-private:...``); None: `delta.signing.trainer_key`
            (``DELTA_SIGNING_KEY``, else the key kept for the bucket, made at the first start). Rank 0's alone counts.
        handover_from: The trainer's previous key, when `signing_key` replaces it (`delta.signing.previous_key` reads
            it from a file or ``DELTA_HANDOVER_FROM``): a handover signed with it goes into the manifest, and readers
            that trust it trust `signing_key` from then on. Its versions count as this trainer's own up to the first
            version `signing_key` signed; on start they are signed again with `signing_key` and committed with the
            handover at once (one manifest write), before any new version. Rank 0's alone counts.
        base_state: The state of the bucket's latest version, if the caller holds it (saves a download
            on resume; one rank only).
        group: A gloo process group for several ranks (default: the default group when
            torch.distributed is initialised with more than one rank).
        **storage_options: Passed to `open_storage` when `bucket` is a URL.

    Threads: one daemon worker thread per publisher; `publish`, `flush` and `close` are for one
    calling thread (with several ranks, every rank calls them at the same points).
    """

    def __init__(
        self,
        bucket: str | Storage,
        config: PublisherConfig | None = None,
        *,
        signing_key: SigningKey | str | None = None,
        handover_from: SigningKey | str | None = None,
        base_state: Mapping[str, torch.Tensor] | None = None,
        group: Any = None,
        **storage_options: Any,
    ) -> None:
        self.storage = bucket if isinstance(bucket, Storage) else open_storage(bucket, **storage_options)
        self.config = config or PublisherConfig()
        self.ranks = Ranks.create(group)
        self._key: SigningKey | None = None  # rank 0's: it signs
        self._handover: Handover | None = None
        manifest, latest, run = None, 0, secrets.token_hex(16)
        if self.ranks.rank == 0:
            self._key = _signing_key(signing_key) if signing_key is not None else trainer_key(self.storage.url)
            previous = _signing_key(handover_from) if handover_from is not None else None
            if previous is not None and previous.public != self._key.public:
                self._handover = make_handover(previous, self._key.public)
            manifest, latest, run = self._own_versions(read_manifest(self.storage), run)
            if manifest is not None:
                manifest = self._take_over(manifest)
        self.session, manifest, latest, self._run_id = self.ranks.broadcast(
            (secrets.token_hex(4), manifest, latest, run)
        )
        self._manifest = manifest
        self._next_version = latest + 1
        self._last_anchor = max((v.version for v in manifest.anchors()), default=0) if manifest else 0
        self._base = self._resume_base(manifest, base_state)
        self._base_digest: SumDigest | None = None  # hashed with the pieces' keys, once they are known
        self.last: PublishedVersion | None = None
        if manifest and manifest.latest:
            self.last = PublishedVersion(latest, manifest.latest.state_hash, manifest.latest.kind, 0, 0.0)
        self._pending: _Snapshot | None = None
        self._pieces: pieces.PieceRecord | None = None  # what this rank's slices are (set by the first publish)
        #: Seconds the last `publish` blocked for its copy, synchronised with the device.
        self.copy_s = 0.0
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
        self._worker.start()

    # -- the trainer's side ----------------------------------------------------------------------------

    def publish(self, state: Mapping[str, Any], *, anchor: bool = False) -> None:
        """Take a snapshot of `state` for publishing as the next version and return.

        Blocks only to copy the tensors (on their device, waiting for the copy to finish there; `copy_s`
        says how long); `state` is not modified and may change as soon as this returns. Encoding and
        upload happen in the background. If a snapshot is already waiting, this one replaces it (written
        over it, keeping its anchor request).

        Args:
            state: This rank's tensors, `delta.pieces.Slice`s or `DTensor`s (`delta.pieces.flatten`); the
                same names, shapes and dtypes every call.
            anchor: Publish a full snapshot with this version (besides the delta).

        Raises:
            PublishError: the background thread stopped on an error (the message says which).
            ValueError: a slice does not fit its tensor, or the slices differ from the first call's.
        """
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
    def public_key(self) -> PublicKey | None:
        """The public key readers check this publisher's versions with (None on ranks other than 0, which sign
        nothing): what to give them, such as ``DELTA_TRUSTED_KEY=<its .text>``."""
        return self._key.public if self._key is not None else None

    @property
    def state_version(self) -> int:
        """The version the state handed in last has in the bucket's numbering: the last committed version (0
        before any), plus one for a snapshot uploading and not yet committed, plus one for a snapshot waiting
        behind it (steps that coalesce while they wait make one version). `last`, the upload and the queue are
        read together, so a commit in between cannot count twice. It changes nothing: unlike
        `flush(timeout=0)`, which with several ranks would make one rank publish a step the others coalesce."""
        with self._cond:
            last = self.last.version if self.last is not None else 0
            return last + self._in_flight + (self._pending is not None)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last snapshot taken is committed; True if it was within `timeout` seconds.

        Raises:
            PublishError: the background thread stopped on an error.
        """
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
            self._worker.join(None if end is None else max(0.0, end - time.monotonic()))
        return done

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise PublishError(f"publishing to {self.storage.url} stopped: {self._error}") from self._error

    # -- resume ---------------------------------------------------------------------------------------

    def _own_versions(self, newest: Manifest | None, run: str) -> tuple[Manifest | None, int, str]:
        """Rank 0: the bucket's manifest cut after the last of its first versions that this trainer signed (with its
        key, or, before its key's first, with the key it hands over from: `trust.own_versions`; an older manifest when
        the newest holds none: a stranger's), or None; the version to go on from (that one, else the bucket's latest:
        a new run); and the run (theirs, else `run`). Versions after its own are said to be someone else's, and left
        behind."""
        if newest is None:
            return None, 0, run
        assert self._key is not None  # rank 0's, which signs
        latest = newest.latest.version if newest.latest else 0
        earlier = [PublicKey.parse(self._handover.old)] if self._handover is not None else []
        for manifest in itertools.chain([newest], manifests_after(self.storage, newest.commit)):
            own = own_versions(manifest, self._key.public, earlier)
            if own:
                entry = manifest.get(own)
                assert entry is not None  # one of its versions
                run = entry.run or run  # a signed version names its run
                break
        mine = self._key.public.fingerprint
        if own and own < latest:
            logger.warning(
                "versions %d..%d of %s are not signed by this trainer's key (%s): someone else's, ignored; "
                "going on from version %d",
                own + 1,
                latest,
                self.storage.url,
                mine,
                own,
            )
        elif own and manifest is not newest:
            logger.warning(
                "the newest manifest of %s lists versions not signed by this trainer's key (%s): someone "
                "else's, ignored; going on from version %d",
                self.storage.url,
                mine,
                own,
            )
        elif latest and not own:
            logger.warning(
                "no version of %s is signed by this trainer's key (%s): starting a new run at version %d; "
                "readers that trust another key refuse it (a new key is introduced with handover_from=the "
                "old key)",
                self.storage.url,
                mine,
                latest + 1,
            )
        return (manifest.upto(own), own, run) if own else (None, latest, run)

    def _take_over(self, manifest: Manifest) -> Manifest:
        """Rank 0, rotating (`handover_from`): commit this trainer's versions signed by the key it hands over from again
        with its key, with the handover, and return that manifest; else `manifest`. One manifest write, no file moved:
        a reader that trusts the old key follows the handover, one given the new key loads every version."""
        assert self._key is not None  # rank 0's, which signs
        mine = self._key.public.text
        if self._handover is None or all(v.signer == mine for v in manifest.versions):
            return manifest
        handovers = manifest.handovers + (() if self._handover in manifest.handovers else (self._handover,))
        taken = resign(replace(manifest, handovers=handovers), self._key)
        taken = write_manifest(self.storage, taken)
        logger.warning(
            "%s: versions %d..%d signed again with this trainer's new key %s, handed over from %s",
            self.storage.url,
            manifest.versions[0].version,
            manifest.versions[-1].version,
            self._key.public.fingerprint,
            PublicKey.parse(self._handover.old).fingerprint,
        )
        return taken

    def _check_base(self, state: Mapping[str, torch.Tensor]) -> None:
        """First publish (every rank): keep the resumed base only if every rank's tensors and slices are laid
        out as in the bucket's latest version; otherwise the next version is an anchor only (a new chain)."""
        base, manifest = self._base, self._manifest
        same = (
            base is not None
            and manifest is not None
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

    def _resume_base(self, manifest: Manifest | None, base_state: Mapping[str, torch.Tensor] | None) -> State | None:
        """The state of the latest committed version for this rank, or None (next version: anchor only). A bucket
        whose hashes are of another scheme (format 2's) starts a new chain with an anchor."""
        base: State | None = None
        latest = manifest.latest if manifest else None
        if latest is not None and scheme_of(latest.state_hash) != SCHEME:
            logger.warning(
                "version %d of %s is hashed with %s: the next version will be an anchor (%s from now on)",
                latest.version,
                self.storage.url,
                scheme_of(latest.state_hash) or "an unknown scheme",
                SCHEME,
            )
            latest = None
        if latest is not None and base_state is not None and self.ranks.world == 1:
            digest = state_digest(base_state, workers=self.config.workers)
            if digest.hexdigest == latest.state_hash:
                base = {k: v.detach().clone() for k, v in base_state.items()}
            else:
                logger.warning(
                    "base_state hashes to %s, the bucket's version %d to %s: pulling it from the bucket",
                    digest.hexdigest,
                    latest.version,
                    latest.state_hash,
                )
        if latest is not None and base is None:
            assert manifest is not None  # it lists `latest`
            try:
                reader = Reader(self.storage)
                try:
                    reader.catch_up(manifest, latest.version)
                finally:
                    reader.close()
                full = reader.flat_state
                assert full is not None  # caught up
                names = manifest.shards[self.ranks.rank] if manifest.shards and self.ranks.world > 1 else sorted(full)
                if manifest.shards is not None and len(manifest.shards) != self.ranks.world:
                    names = []
                base = {n: full[n] for n in names} or None
            except (DeltaError, OSError) as e:
                logger.warning(
                    "cannot pull version %d from %s (%s): the next version will be an anchor only",
                    latest.version,
                    self.storage.url,
                    e,
                )
        return base if self.ranks.all(base is not None) else None

    # -- the background side ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending is not None and self._pending.ready and self._due()) and not self._closing:
                    due_in = self._committed_at + self.config.min_interval - time.monotonic()
                    self._cond.wait(due_in if self._pending is not None and due_in > 0 else None)
                if self._pending is None or not self._pending.ready:
                    return
                snapshot, self._pending, self._busy, self._in_flight = self._pending, None, True, True
                self._hurry = False
            try:
                self._publish_with_retries(snapshot)
            except BaseException as e:  # recorded for the trainer's thread, which raises it
                logger.exception("publisher on %s stopped", self.storage.url)
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
        return self._hurry or self.ranks.world > 1 or time.monotonic() >= self._committed_at + self.config.min_interval

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
            others = self.ranks.collect(self.storage, folder, self.config.commit_timeout)
            manifest = self._commit(version, [record, *others], snapshot.taken_at)
        else:
            self.ranks.submit(self.storage, folder, record)
            manifest = self.ranks.wait_commit(self.storage, version, folder, self.config.commit_timeout)
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
        self.storage.write(path, data)
        return file_ref(path, data, self.ranks.rank)

    def _commit(self, version: int, records: list[dict], taken_at: float) -> Manifest:
        """Rank 0: commit `version` made of every rank's record, then apply retention and collect garbage."""
        records = sorted(records, key=lambda r: r["rank"])
        digest = SumDigest({})
        for r in records:
            part = SumDigest.from_json(r["tensors"])
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
            current = replace(current, handovers=current.handovers + (self._handover,))
        assert self._key is not None  # rank 0's, which commits
        signed = sign_latest(current.with_version(entry, shards, layout), self._key, self._run_id)
        listed = self.storage.list()  # one listing to number the commit and collect garbage by
        manifest = write_manifest(self.storage, retain(signed, self.config.keep_anchors), listed)
        collect_garbage(self.storage, manifest, listed)
        return manifest


def _signing_key(key: SigningKey | str) -> SigningKey:
    return key if isinstance(key, SigningKey) else SigningKey.parse(key)


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
