"""Reader side: follow a bucket's versions and keep a state equal, bit for bit, to the trainer's.

    sub = Subscriber("s3://bucket/run", on_update=lambda u: engine.reload(u.changed))
    sub.sync()            # blocking catch-up to the latest version
    sub.start()           # or follow in a background thread; writes happen under `sub.lock`

Each version is fetched, verified (size and SHA-256 of every file against the manifest) and decoded
against the current state without touching it; only then is it written, under `lock` — the only
pause a consumer sees. A file that fails its check is fetched once more, then avoided: the reader
re-plans through an anchor. Nothing partial is ever written and the version never advances on a
failure.

Sharded writers (the manifest's `pieces`, `delta.pieces`): the state holds full tensors; each piece
is read and written through a view of its range of the full tensor (in place where the range is
contiguous, as FSDP2's dim-0 shards are; through a copy written back after each version otherwise).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import pieces
from .anchors import decode_anchor
from .apply import Rollback, decode, write_changes
from .catchup import Step, plan
from .errors import DeltaError, DeltaFormatError, IntegrityError, StateMismatchError
from .format import DeltaHeader
from .hashing import StateDigest, state_digest
from .manifest import FileRef, Manifest, fetch_verified, read_manifest
from .retry import RetryPolicy
from .state import State, check_same_layout
from .storage import Storage, open_storage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriberConfig:
    """Settings of a `Subscriber`.

    Attributes:
        poll_interval: Seconds between manifest polls while up to date.
        max_backoff: Longest wait between polls after failures (doubling from `poll_interval`, with
            jitter: `delta.retry.RetryPolicy`).
        fetch_threads: Files of one step fetched in parallel (anchor shards, one delta per rank).
        history: Per-version statistics kept for `status()`.
        workers: Threads that decode chunks (None: one per core).
    """

    poll_interval: float = 1.0
    max_backoff: float = 30.0
    fetch_threads: int = 4
    history: int = 100
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.max_backoff < self.poll_interval:
            raise ValueError(f"need 0 < poll_interval <= max_backoff, got {self.poll_interval} and {self.max_backoff}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1 (or None: one per core), got {self.workers}")
        if self.fetch_threads < 1 or self.history < 1:
            raise ValueError(f"fetch_threads and history must be >= 1, got {self.fetch_threads}, {self.history}")


@dataclass(frozen=True)
class VersionStats:
    """How one applied version went.

    Attributes:
        version: The version reached.
        via: "delta" or "anchor".
        bytes_fetched: Bytes read from the bucket for it (refetches included).
        fetch_s: Seconds spent fetching and verifying files.
        decode_s: Seconds decoding and validating (in the background, the state still usable).
        apply_pause_s: Seconds the state was locked for writing: what a consumer waits.
        lag_s: Seconds from the manifest read that revealed the version to its apply.
    """

    version: int
    via: str
    bytes_fetched: int
    fetch_s: float
    decode_s: float
    apply_pause_s: float
    lag_s: float


@dataclass(frozen=True)
class SubscriberStatus:
    """A snapshot of a subscriber's progress.

    Attributes:
        version: The version the state holds, or None before the first apply.
        latest: The newest version seen in the bucket.
        lag: latest - version (None when either is unknown).
        last_error: The most recent failure, as text, or None.
        failures: Failures so far (bad files, unreachable bucket, ...); each was recovered from or retried.
        history: Statistics of the most recently applied versions, oldest first.
    """

    version: int | None
    latest: int | None
    lag: int | None
    last_error: str | None
    failures: int
    history: tuple[VersionStats, ...]


@dataclass(frozen=True)
class Update:
    """What `on_update` receives after each applied version (in the thread that applied it).

    Attributes:
        version: The version now held.
        changed: Names of the tensors written (every tensor after an anchor).
        stats: How the version went.
        headers: The headers of the delta files applied (one per rank; empty after an anchor): which
            tensors changed and how many elements of each.
        published_at: Unix time the trainer handed this version to its publisher (None if the manifest
            does not say).
    """

    version: int
    changed: tuple[str, ...]
    stats: VersionStats
    headers: tuple[DeltaHeader, ...] = ()
    published_at: float | None = None


class _BadFiles(DeltaError):
    """Internal: a step cannot be used; `paths` are to be avoided."""

    def __init__(self, paths: list[str], cause: Exception) -> None:
        super().__init__(f"cannot use {paths}: {type(cause).__name__}: {cause}")
        self.paths = paths


@dataclass
class _Prepared:
    step: Step
    payload: Any  # per delta file (header, changes, sub-state, its digest); (fresh state, digest, full state) for an anchor
    fetched: int
    fetch_s: float
    decode_s: float


class Subscriber:
    """Follows a bucket and keeps `state` at its newest version (or a chosen one).

    Args:
        bucket: URL for `open_storage`, or an open `Storage`.
        state: Tensors to update in place (contiguous; on the CPU or a GPU: see `delta.apply`). None: the
            first anchor becomes the state (on the CPU).
        version: The version `state` holds, if known (checked against the manifest's hashes); None
            means unknown, so the first step loads an anchor into `state`.
        config: Polling and fetching settings.
        on_update: Called after each applied version with an `Update`, in the applying thread,
            outside `lock`. An exception it raises is logged, not propagated.
        **storage_options: Passed to `open_storage` when `bucket` is a URL.

    Threads: `sync` blocks the caller; `start` runs the same loop in a daemon thread. Decoding reads
    the state while others may read it too; every write into it happens under `lock` (hold it while
    reading the state to see one version throughout).
    """

    def __init__(self, bucket: str | Storage, state: State | None = None, *, version: int | None = None,
                 config: SubscriberConfig | None = None, on_update: Callable[[Update], None] | None = None,
                 **storage_options: Any) -> None:
        self.storage = bucket if isinstance(bucket, Storage) else open_storage(bucket, **storage_options)
        self.config = config or SubscriberConfig()
        self.on_update = on_update
        self.lock = threading.RLock()
        self._state = state  # what files name: tensors and pieces (views of `_full`'s tensors when sharded)
        self._full = state  # what callers see: full tensors
        self._layout: pieces.Layout = {}
        self._version = version if state is not None else None
        self._digest: StateDigest | None = state_digest(state) if state is not None and version is not None else None
        self._advanced = threading.Condition()  # notified each time `_version` changes (`wait_for` waits on it)
        self._sync_lock = threading.Lock()
        self._latest: int | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._history: deque[VersionStats] = deque(maxlen=self.config.history)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(self.config.fetch_threads, thread_name_prefix="delta-fetch")

    @property
    def state(self) -> State | None:
        """The live state, full tensors (updated in place; an anchor loaded into an empty subscriber
        replaces None)."""
        return self._full

    @property
    def flat_state(self) -> State | None:
        """The state as the files name it: the pieces of sharded tensors under piece names (views of
        `state`'s tensors where contiguous), the other tensors as in `state`."""
        return self._state

    @property
    def version(self) -> int | None:
        return self._version

    @property
    def digest(self) -> StateDigest | None:
        """The digest of `flat_state` at `version` (for unsharded writers, of `state`)."""
        return self._digest

    def status(self) -> SubscriberStatus:
        lag = None if self._latest is None or self._version is None else self._latest - self._version
        return SubscriberStatus(self._version, self._latest, lag, self._last_error, self._failures,
                                tuple(self._history))

    def sync(self, version: int | None = None) -> int | None:
        """Catch up to `version` (default: the newest committed) and return the version held.

        Blocks until done. Tries every route the manifest offers around bad files before giving up.

        Raises:
            NoPathError: no route around the bad files (the state is untouched at its old version).
            BucketUnreachableError, StorageError: the bucket failed.
            DeltaFormatError: the manifest cannot be parsed.
        """
        with self._sync_lock:
            try:
                return self._catch_up(version)
            except (DeltaError, OSError) as e:
                self._record(e)
                raise

    def start(self) -> None:
        """Follow the bucket in a daemon thread: poll, catch up, back off on failures.

        No failure ends the thread: each is counted in `status()` (with `last_error`), the version
        stays where it was, and the step is tried again after a back-off.
        """
        if self._thread is not None:
            raise RuntimeError("this subscriber is already following; call close() first")
        self._stop.clear()
        self._thread = threading.Thread(target=self._follow, name="delta-subscriber", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop following (waits up to `timeout` s for a step in progress) and release the fetch threads."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until the state holds `version` or newer; False after `timeout` seconds."""
        with self._advanced:
            return self._advanced.wait_for(lambda: (self._version or 0) >= version, timeout)

    # -- the loop --------------------------------------------------------------------------------

    def _follow(self) -> None:
        policy = RetryPolicy(None, 2 * self.config.poll_interval, self.config.max_backoff)
        failures = 0
        while not self._stop.is_set():
            with self._sync_lock:
                try:
                    self._catch_up(None)
                    failures = 0
                except (DeltaError, OSError) as e:
                    self._record(e)
                    failures += 1
                except Exception as e:  # anything else (a bug, MemoryError, ...): recorded and retried, never fatal
                    logger.exception("subscriber on %s: unexpected failure, retrying", self.storage.url)
                    self._record(e)
                    failures += 1
            self._stop.wait(policy.delay(failures) if failures else self.config.poll_interval)

    def _record(self, error: BaseException) -> None:
        self._failures += 1
        self._last_error = f"{type(error).__name__}: {error}"
        logger.warning("subscriber on %s: %s", self.storage.url, self._last_error)

    def _catch_up(self, version: int | None) -> int | None:
        seen_at = time.monotonic()
        manifest = read_manifest(self.storage)
        if manifest is None or manifest.latest is None:
            return self._version
        self._latest = manifest.latest.version
        self._adopt_layout(manifest.pieces or {})
        target = manifest.latest.version if version is None else version
        avoid: set[str] = set()
        while self._version != target and not self._stop.is_set():
            have_hash = self._digest.hexdigest if self._digest is not None else None
            step = plan(manifest, target, have=self._version, have_hash=have_hash, avoid=avoid)[0]
            try:
                prepared = self._prepare(step, manifest)
                self._apply(prepared, seen_at)
            except _BadFiles as e:
                self._record(e)
                avoid.update(e.paths)
        return self._version

    def _adopt_layout(self, layout: pieces.Layout) -> None:
        """Read and write the held state through the pieces `layout` names (a sharded writer's, or none)."""
        if layout == self._layout:
            return
        if self._full is not None:
            flat = pieces.piece_views(self._full, layout) if layout else self._full
            with self.lock:
                self._state = flat
                if self._digest is not None:
                    self._digest = state_digest(flat)
        self._layout = layout

    # -- one step: fetch + decode (no lock), then write (lock) ---------------------------------------

    def _fetch(self, ref: FileRef) -> tuple[bytes, int]:
        """Fetch and verify one file, once more if it fails; returns (data, bytes read)."""
        try:
            return fetch_verified(self.storage, ref), ref.size
        except (IntegrityError, FileNotFoundError) as first:
            logger.warning("%s: %s; fetching it again", ref.path, first)
            try:
                return fetch_verified(self.storage, ref), 2 * ref.size
            except (IntegrityError, FileNotFoundError) as e:
                raise _BadFiles([ref.path], e) from e

    def _prepare(self, step: Step, manifest: Manifest) -> _Prepared:
        start = time.perf_counter()
        results = list(self._pool.map(self._fetch, step.files))
        fetched = sum(n for _, n in results)
        decoded = time.perf_counter()
        datas = [data for data, _ in results]
        try:
            payload = (self._decode_anchor(step, datas) if step.via == "anchor"
                       else self._decode_deltas(step, datas, manifest))
        except (DeltaFormatError, StateMismatchError, IntegrityError) as e:
            raise _BadFiles([f.path for f in step.files], e) from e
        return _Prepared(step, payload, fetched, decoded - start, time.perf_counter() - decoded)

    def _decode_anchor(self, step: Step, datas: list[bytes]) -> tuple[State, StateDigest, State | None]:
        fresh: State = {}
        for rank in sorted({f.rank for f in step.files}):  # each rank's shards make one anchor of its tensors
            mine = [(f.path, data) for f, data in zip(step.files, datas) if f.rank == rank]
            part = decode_anchor([d for _, d in mine], version=step.entry.version, paths=[p for p, _ in mine])
            if fresh.keys() & part.keys():
                raise DeltaFormatError(f"rank {rank}'s anchor repeats tensors of another rank", path=mine[0][0])
            fresh.update(part)
        digest = state_digest(fresh)
        if digest.hexdigest != step.entry.state_hash:
            raise IntegrityError(f"anchor of version {step.entry.version} does not hash to the manifest's state hash",
                                 expected=step.entry.state_hash, actual=digest.hexdigest)
        if self._state is not None:
            check_same_layout(self._state, fresh)
            return fresh, digest, None
        full = pieces.assemble(fresh, self._layout) if self._layout else fresh
        return fresh, digest, full

    def _decode_deltas(self, step: Step, datas: list[bytes], manifest: Manifest) -> list[tuple]:
        out = []
        for ref, data in zip(step.files, datas):
            names = manifest.shards[ref.rank] if manifest.shards is not None else sorted(self._state)
            sub = {n: self._state[n] for n in names}
            sub_digest = StateDigest({n: self._digest.tensors[n] for n in names})
            header, changes, _ = decode(data, sub, path=ref.path, digest=sub_digest, workers=self.config.workers)
            if manifest.shards is None and header.target_hash != step.entry.state_hash:
                # One writer: the file's target must be the version's state, checked before any write.
                raise IntegrityError(f"{ref.path} leads to another state than version {step.entry.version}",
                                     expected=step.entry.state_hash, actual=header.target_hash, path=ref.path)
            out.append((header, changes, sub, sub_digest))
        return out

    def _apply(self, prepared: _Prepared, seen_at: float) -> None:
        entry = prepared.step.entry
        with self.lock:
            start = time.perf_counter()
            if prepared.step.via == "anchor":
                fresh, digest, full = prepared.payload
                if self._state is None:
                    self._full = full
                    self._state = pieces.piece_views(full, self._layout) if self._layout else full
                else:
                    for name, tensor in fresh.items():
                        self._state[name].copy_(tensor)
                    pieces.write_back(self._full, self._state, self._layout)
                changed = tuple(sorted(self._full))
                headers: tuple[DeltaHeader, ...] = ()
            else:
                try:
                    digest, changed = self._write_deltas(prepared.payload, entry.state_hash)
                except IntegrityError as e:
                    raise _BadFiles([f.path for f in prepared.step.files], e) from e
                headers = tuple(header for header, *_ in prepared.payload)
            self._digest, self._version = digest, entry.version
            pause = time.perf_counter() - start
            with self._advanced:
                self._advanced.notify_all()
        stats = VersionStats(entry.version, prepared.step.via, prepared.fetched, prepared.fetch_s, prepared.decode_s,
                             pause, time.monotonic() - seen_at)
        self._history.append(stats)
        if self.on_update is not None:
            try:
                self.on_update(Update(entry.version, changed, stats, headers, entry.published_at))
            except Exception:  # the consumer's bug must not stop the follower
                logger.exception("on_update callback failed for version %d", entry.version)

    def _write_deltas(self, decoded: list[tuple], state_hash: str) -> tuple[StateDigest, tuple[str, ...]]:
        """Write every rank's changes, all or nothing: earlier ranks are rolled back if a later one fails.

        Raises:
            IntegrityError: a rank's result or the whole state does not hash as recorded (state restored).
        """
        tensors = dict(self._digest.tensors)
        rollback = Rollback()
        changed: set[str] = set()
        try:
            for header, changes, sub, sub_digest in decoded:
                result = write_changes(header, changes, sub, sub_digest, rollback)
                tensors.update(result.digest.tensors)
                changed.update(c.name for c in changes)
            digest = StateDigest(tensors)
            if digest.hexdigest != state_hash:
                raise IntegrityError("state after applying does not match the manifest's state hash",
                                     expected=state_hash, actual=digest.hexdigest)
        except BaseException:  # a mismatch, or anything that stopped the writes half way: undo them all
            rollback.restore()
            raise
        pieces.write_back(self._full, self._state, self._layout, changed)
        owner = pieces.owners(self._layout)
        return digest, tuple(sorted({owner.get(n, n) for n in changed}))
