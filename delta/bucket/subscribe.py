"""Reader side: follow a bucket's versions and keep a state equal, bit for bit, to the trainer's.

    sub = Subscriber("s3://bucket/run", on_update=lambda u: engine.reload(u.changed))
    sub.sync()            # blocking catch-up to the latest version
    sub.start()           # or follow in a background thread; writes happen under `sub.lock`

A `Subscriber` polls the manifest and moves its `Reader` (`reader.py`: check the trainer's signature, fetch, verify,
decode, then write under `lock`; nothing partial is ever written) to each newest version, counting failures and
backing off from them, and reports each version applied to `on_update`. A version the trainer did not sign is
refused (`trust.Trust`: the trainer's key, given or trusted on first use), counted apart from failures, and the
subscriber waits for the trainer's next version as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._cores import resolve_workers
from ..errors import DeltaError, StorageError, UntrustedVersionError, printable
from ..format import DeltaHeader
from ..poll import Backoff
from ..storage import Storage, open_storage
from ..tensors.hashing import StateDigest
from ..tensors.state import State
from .manifest import PolledManifests, read_manifest
from .reader import Applied, Reader
from .trust import Trust

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriberConfig:
    """Settings of a `Subscriber`.

    Attributes:
        poll_interval: Seconds between manifest polls while versions come.
        max_backoff: Longest wait between polls after failures (doubling from `poll_interval`, with
            jitter: `delta.poll.Backoff`; after a 429, until the time the bucket named).
        idle_poll_max: Longest wait between polls while nothing new comes (doubling from `poll_interval`, back to it
            at the first new version): what a reader at rest costs the bucket. None: never stretched.
        version_interval: The publisher's least interval between versions (`PublisherConfig.min_interval`, one rank):
            after a new version the next poll waits this long, as none comes sooner, then polls go on from
            `poll_interval` (one listing or two per version instead of one per `poll_interval`). A version published
            sooner (a flushed last version, a publisher of several ranks) is seen up to this late. None: not known.
        fetch_threads: Files of one step fetched in parallel (anchor shards, one delta per rank).
        history: Per-version statistics kept for `status()`.
        workers: Threads that decode chunks (None: one per core).
    """

    poll_interval: float = 1.0
    max_backoff: float = 30.0
    idle_poll_max: float | None = None
    version_interval: float | None = None
    fetch_threads: int = 4
    history: int = 100
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.max_backoff < self.poll_interval:
            raise ValueError(f"need 0 < poll_interval <= max_backoff, got {self.poll_interval} and {self.max_backoff}")
        if self.idle_poll_max is not None and self.idle_poll_max < self.poll_interval:
            raise ValueError(f"idle_poll_max must be >= poll_interval, got {self.idle_poll_max}")
        if self.version_interval is not None and self.version_interval < self.poll_interval:
            raise ValueError(f"version_interval must be >= poll_interval, got {self.version_interval}")
        resolve_workers(self.workers)
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
        manifests_refused: Manifests in the bucket refused now (too large, torn, crafted), each skipped unread
            until its listing changes; the newest one before them is followed.
        versions_refused: Versions refused so far because the trusted key did not sign them (unsigned, forged,
            another key, another run), each counted once; nothing of them was applied.
        last_refusal: Why the last one was refused, as text, or None.
        trust: Which key versions are checked with, and why it is trusted (`Trust.describe`).
        authenticated: False when the bucket is followed unauthenticated (whoever writes to it decides the weights).
    """

    version: int | None
    latest: int | None
    lag: int | None
    last_error: str | None
    failures: int
    history: tuple[VersionStats, ...]
    manifests_refused: int = 0
    versions_refused: int = 0
    last_refusal: str | None = None
    trust: str = ""
    authenticated: bool = True


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


class Subscriber:
    """Follows a bucket and keeps `state` at its newest version (or a chosen one).

    Args:
        bucket: URL for `open_storage`, or an open `Storage`.
        state: Tensors to update in place (contiguous; on the CPU or a GPU: see `delta.apply`). None: the
            first anchor becomes the state (on the CPU).
        version: The version `state` holds, if known (checked against the manifest's hashes); None
            means unknown, so the first step loads an anchor into `state`.
        digest: `state`'s digest (`delta.state_digest`), if the caller has hashed it already: the first
            catch-up then skips hashing the whole state. None: hashed then.
        config: Polling and fetching settings.
        on_update: Called after each applied version with an `Update`, in the applying thread,
            outside `lock`. An exception it raises is logged, not propagated.
        trust: Whose versions to apply (`delta.Trust`); None: `Trust.for_bucket(url)` (``DELTA_TRUSTED_KEY``, else the
            key trusted on first use, kept per bucket). `Trust.unauthenticated_for(url)` follows an unsigned bucket.
        **storage_options: Passed to `open_storage` when `bucket` is a URL.

    Raises:
        KeyFormatError, PrivateFileError: `trust` is None and ``DELTA_TRUSTED_KEY`` or the key kept for the bucket is
            not a public key, or its file is a link, a FIFO, a folder or another user's.

    Threads: `sync` blocks the caller; `start` runs the same loop in a daemon thread. Decoding reads
    the state while others may read it too; every write into it happens under `lock` (hold it while
    reading the state to see one version throughout).
    """

    def __init__(
        self,
        bucket: str | Storage,
        state: State | None = None,
        *,
        version: int | None = None,
        digest: StateDigest | None = None,
        config: SubscriberConfig | None = None,
        on_update: Callable[[Update], None] | None = None,
        trust: Trust | None = None,
        **storage_options: Any,
    ) -> None:
        self.storage = bucket if isinstance(bucket, Storage) else open_storage(bucket, **storage_options)
        self.config = config or SubscriberConfig()
        self.on_update = on_update
        self.trust = trust or Trust.for_bucket(self.storage.url)
        self._reader = Reader(
            self.storage,
            state,
            version=version,
            digest=digest,
            fetch_threads=self.config.fetch_threads,
            workers=self.config.workers,
            trust=self.trust,
        )
        self.lock = self._reader.lock
        self._sync_lock = threading.Lock()
        self._latest: int | None = None
        self._last_error: str | None = None
        self._refused: str | None = None  # the last manifest refused, as warned
        self._polled = (
            PolledManifests()
        )  # manifests refused (skipped unread until their listing changes), the last one read
        self._failures = 0
        self._refusals = 0
        self._last_refusal: str | None = None
        self._refused_at: tuple[int, int | None, str] | None = None  # (manifest commit, version, reason) counted last
        self._history: deque[VersionStats] = deque(maxlen=self.config.history)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> State | None:
        """The live state, full tensors (updated in place; an anchor loaded into an empty subscriber
        replaces None)."""
        return self._reader.state

    @property
    def flat_state(self) -> State | None:
        """The state as the files name it: the pieces of sharded tensors under piece names (views of
        `state`'s tensors where contiguous), the other tensors as in `state`."""
        return self._reader.flat_state

    @property
    def version(self) -> int | None:
        return self._reader.version

    @property
    def digest(self) -> StateDigest | None:
        """The digest of the state at `version` (its `hexdigest` is the state hash, the same whole or in pieces)."""
        return self._reader.digest

    def status(self) -> SubscriberStatus:
        version = self._reader.version
        lag = None if self._latest is None or version is None else self._latest - version
        return SubscriberStatus(
            version,
            self._latest,
            lag,
            self._last_error,
            self._failures,
            tuple(self._history),
            len(self._polled.refused),
            self._refusals,
            self._last_refusal,
            self.trust.describe(),
            not self.trust.unauthenticated,
        )

    def sync(self, version: int | None = None, *, max_age: float = 0.0) -> int | None:
        """Catch up to `version` (default: the newest committed) and return the version held.

        Blocks until done. Tries every route the manifest offers around bad files before giving up. `max_age`: how
        old a listing of the bucket this process made may be to find the newest manifest in (0: listed now).

        Raises (only `DeltaError`s, whatever the bucket holds):
            UntrustedVersionError: a version on the way is not the trusted key's (counted in `status()`'s
                `versions_refused`; the state holds the version before it).
            NoPathError: no route around the bad files (the state is untouched at its old version).
            BucketUnreachableError, StorageError: the bucket failed (another OSError becomes a StorageError).
            DeltaFormatError: no manifest in the bucket parses (a newest one that does not is skipped for the
                one before it, with a warning).
        """
        with self._sync_lock:
            try:
                return self._catch_up(version, max_age)
            except UntrustedVersionError:
                raise
            except DeltaError as e:
                self._record(e)
                raise
            except OSError as e:
                error = StorageError(f"{type(e).__name__}: {e}", url=self.storage.url)
                self._record(error)
                raise error from e

    def start(self) -> None:
        """Follow the bucket in a daemon thread: poll, catch up, back off on failures.

        No failure ends the thread: each is counted in `status()` (with `last_error`), the version
        stays where it was, and the step is tried again after a back-off. A version refused (not the trusted key's)
        is no failure: the bucket is polled as usual for the trainer's next version.
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
        self._reader.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until the state holds `version` or newer; False after `timeout` seconds."""
        return self._reader.wait_for(version, timeout)

    # -- the loop --------------------------------------------------------------------------------

    def _follow(self) -> None:
        c = self.config
        backoff = Backoff(c.poll_interval, c.max_backoff, c.idle_poll_max, after_change=c.version_interval)
        while not self._stop.is_set():
            with self._sync_lock:
                seen = (self._latest, self._reader.version)
                try:
                    self._catch_up(None, self.config.poll_interval)
                    backoff.succeeded(changed=(self._latest, self._reader.version) != seen)
                except UntrustedVersionError:  # counted by `_catch_up`; the trainer's next version is awaited
                    backoff.succeeded(changed=True)
                except (DeltaError, OSError) as e:  # a rate limit too: the next look waits for the time it names
                    self._record(e)
                    backoff.failed(e)
                except Exception as e:  # anything else (a bug, MemoryError, ...): recorded and retried, never fatal
                    logger.exception("subscriber on %s: unexpected failure, retrying", self.storage.url)
                    self._record(e)
                    backoff.failed(e)
            backoff.wait(self._stop)

    def _record(self, error: BaseException) -> None:
        self._failures += 1
        self._last_error = printable(f"{type(error).__name__}: {error}")  # what a file put in it, escaped
        logger.warning("subscriber on %s: %s", self.storage.url, self._last_error)

    def _refused_manifest(self, error: DeltaError) -> None:
        """A newest manifest that does not parse: warned about once (it is skipped at every poll after)."""
        text = printable(str(error))
        if text != self._refused:
            self._refused = text
            logger.warning("subscriber on %s: skipping a manifest: %s", self.storage.url, text)

    def _catch_up(self, version: int | None, max_age: float = 0.0) -> int | None:
        """Catch up to `version` (None: the newest); `max_age`: how old a listing of the bucket this process made may
        be to list the manifests from (the follow loop's poll; 0 for `sync`)."""
        seen_at = time.monotonic()
        manifest = read_manifest(self.storage, on_refused=self._refused_manifest, polled=self._polled, max_age=max_age)
        if manifest is None or manifest.latest is None:
            return self._reader.version
        self._latest = manifest.latest.version
        target = manifest.latest.version if version is None else version
        try:
            return self._reader.catch_up(
                manifest,
                target,
                stopped=self._stop.is_set,
                on_bad_files=self._record,
                on_applied=lambda applied: self._report(applied, seen_at),
            )
        except UntrustedVersionError as e:
            self._refuse(e, manifest.commit)
            raise

    def _refuse(self, error: UntrustedVersionError, commit: int) -> None:
        """Count a version refused, once per manifest that offers it (it is polled again and again), and say why."""
        if self._refused_at == (commit, error.version, error.reason):
            return
        self._refused_at = (commit, error.version, error.reason)
        self._refusals += 1
        self._last_refusal = printable(str(error))
        logger.warning("subscriber on %s: REFUSED %s", self.storage.url, self._last_refusal)

    def _report(self, applied: Applied, seen_at: float) -> None:
        """Keep the statistics of a version just applied and hand it to `on_update`."""
        stats = VersionStats(
            applied.entry.version,
            applied.via,
            applied.bytes_fetched,
            applied.fetch_s,
            applied.decode_s,
            applied.pause_s,
            time.monotonic() - seen_at,
        )
        self._history.append(stats)
        if self.on_update is not None:
            try:
                self.on_update(
                    Update(applied.entry.version, applied.changed, stats, applied.headers, applied.entry.published_at)
                )
            except Exception:  # the consumer's bug must not stop the follower
                logger.exception("on_update callback failed for version %d", applied.entry.version)
