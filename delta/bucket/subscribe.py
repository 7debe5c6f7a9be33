"""Reader side: follow a bucket's versions and keep a state equal, bit for bit, to the trainer's.

    sub = Subscriber("s3://bucket/run", on_update=lambda u: engine.reload(u.changed))
    sub.sync()            # blocking catch-up to the latest version
    sub.start()           # or follow in a background thread; writes happen under `sub.lock`

A `Subscriber` polls the manifest, moves its `Reader` (`reader.py`) to each newest version and reports it to
`on_update`, backing off from failures. How often it looks follows the bucket's budget (`Bucket.budget`). A version
the trainer did not sign (`Bucket.trust`) is refused, counted apart from failures, and the next one awaited; so is a
newest manifest that ends before a version a reader of the bucket applied (`seen.py`: readers never go back)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .._cores import resolve_workers
from ..errors import DeltaError, StorageError, UntrustedVersionError, printable
from ..format import DeltaHeader
from ..poll import Backoff
from ..storage import Storage
from ..tensors.hashing import StateDigest
from ..tensors.state import State
from .budget import Budget
from .handle import Bucket
from .manifest import Manifest, newest_manifest
from .reader import Applied, Reader
from .trust import Trust

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriberConfig:
    """Settings of a `Subscriber`; None: the bucket's budget's (`delta.Budget`).

    Attributes:
        poll_interval: Seconds between manifest polls while versions come.
        max_backoff: Longest wait between polls after failures (`delta.poll.Backoff`; after a 429, until the time the
            bucket named).
        idle_poll_max: Longest wait between polls while nothing new comes (doubling from `poll_interval`): what a
            reader at rest costs the bucket.
        version_interval: After a new version, the wait before the next poll, as none comes sooner (the publisher's
            `min_interval`).
        fetch_threads: Files of one step fetched in parallel (anchor shards, one delta per rank).
        history: Per-version statistics kept for `status()`.
        workers: Threads that decode chunks (None: one per core).
    """

    poll_interval: float | None = None
    max_backoff: float = 30.0
    idle_poll_max: float | None = None
    version_interval: float | None = None
    fetch_threads: int = 4
    history: int = 100
    workers: int | None = None

    def __post_init__(self) -> None:
        poll = self.poll_interval
        if poll is not None and not 0 < poll <= self.max_backoff:
            raise ValueError(f"need 0 < poll_interval <= max_backoff, got {poll} and {self.max_backoff}")
        for name in ("idle_poll_max", "version_interval"):
            if (value := getattr(self, name)) is not None and value < (poll or 0):
                raise ValueError(f"{name} must be >= poll_interval, got {value}")
        resolve_workers(self.workers)
        if self.fetch_threads < 1 or self.history < 1:
            raise ValueError(f"fetch_threads and history must be >= 1, got {self.fetch_threads}, {self.history}")

    def for_budget(self, budget: Budget) -> SubscriberConfig:
        """These settings with what they leave open taken from `budget` (a bucket's)."""
        poll = self.poll_interval if self.poll_interval is not None else budget.poll_s
        idle = self.idle_poll_max if self.idle_poll_max is not None else max(poll, budget.idle_poll_s)
        after = self.version_interval if self.version_interval is not None else budget.version_interval
        return replace(
            self,
            poll_interval=poll,
            max_backoff=max(self.max_backoff, poll),
            idle_poll_max=idle,
            version_interval=None if after is None else max(after, poll),
        )


@dataclass(frozen=True)
class VersionStats:
    """How one applied version went: `via` "delta" or "anchor", the bytes read (refetches included), the seconds spent
    fetching and verifying, decoding (the state still usable), and with the state locked (`apply_pause_s`: what a
    consumer waits), and `lag_s` from the manifest read that revealed the version to its apply."""

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
        latest: The newest version seen in the bucket that the trusted key signed; `lag`: latest - version.
        last_error: The most recent failure, as text; `failures`: how many so far (each recovered from or retried).
        history: Statistics of the most recently applied versions, oldest first.
        manifests_refused: Manifests refused now (too large, torn, crafted), skipped unread until their listing
            changes.
        versions_refused: Versions the trusted key did not sign, each counted once; `last_refusal`: why the last.
        trust: Which key versions are checked with, and why it is trusted (`Trust.describe`).
        authenticated: False when the bucket is followed unauthenticated.
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
    """What `on_update` receives after each applied version: the `version` now held, the names of the tensors
    `changed` (every tensor after an anchor), its `stats`, the `headers` of the delta files applied (one per rank;
    none after an anchor) and when the trainer published it (`published_at`, Unix time, if the manifest says)."""

    version: int
    changed: tuple[str, ...]
    stats: VersionStats
    headers: tuple[DeltaHeader, ...] = ()
    published_at: float | None = None


class Subscriber:
    """Follows a bucket and keeps `state` at its newest version (or a chosen one).

    Args:
        bucket: A `delta.Bucket`, a `Storage`, or a URL (opened with `options`: `token`, `trusted_key`, ...).
        state: Tensors to update in place (contiguous; CPU or GPU). None: the first anchor becomes the state.
        version: The version `state` holds, if known (checked against the manifest's hashes); None: the first step
            loads an anchor.
        digest: `state`'s digest, if the caller has it already (the first catch-up then skips hashing the state).
        config: Polling and fetching settings.
        on_update: Called after each applied version with an `Update`, in the applying thread, outside `lock`; what
            it raises is logged.
        trust: Whose versions to apply; None: the bucket's (`Bucket.trust`).

    Raises (at the first catch-up, as `Bucket.trust`):
        KeyFormatError, PrivateFileError: the trusted key is not a public key, or its file is not a private file.

    Threads: `sync` blocks the caller; `start` runs the same loop in a daemon thread. Every write into the state
    happens under `lock` (hold it while reading the state to see one version throughout).
    """

    def __init__(
        self,
        bucket: Bucket | Storage | str,
        state: State | None = None,
        *,
        version: int | None = None,
        digest: StateDigest | None = None,
        config: SubscriberConfig | None = None,
        on_update: Callable[[Update], None] | None = None,
        trust: Trust | None = None,
        **options: Any,
    ) -> None:
        self.bucket = Bucket.of(bucket, **options)
        self.config = (config or SubscriberConfig()).for_budget(self.bucket.budget)
        self.on_update = on_update
        self._trust = trust
        self._reader = Reader(
            self.bucket,
            state,
            version=version,
            digest=digest,
            fetch_threads=self.config.fetch_threads,
            workers=self.config.workers,
        )
        self.lock = self._reader.lock
        self._sync_lock = threading.Lock()
        self._latest: int | None = None
        self._last_error: str | None = None
        self._refused: str | None = None  # the last manifest refused, as warned
        self._manifests_refused = 0  # newer than the one followed, at the last poll
        self._failures = 0
        self._refusals = 0
        self._last_refusal: str | None = None
        self._refused_at: tuple[int, int | None, str] | None = None  # (manifest commit, version, reason) counted last
        self._history: deque[VersionStats] = deque(maxlen=self.config.history)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def storage(self) -> Storage:
        """The bucket's storage (its `traffic` is what following costs)."""
        return self.bucket.storage

    @property
    def trust(self) -> Trust:
        """Whose versions are applied (the one given, else the bucket's)."""
        if self._trust is None:
            self._trust = self.bucket.trust
        return self._trust

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
            self._manifests_refused,
            self._refusals,
            self._last_refusal,
            self.trust.describe(),
            not self.trust.unauthenticated,
        )

    def sync(self, version: int | None = None, *, max_age: float = 0.0) -> int | None:
        """Catch up to `version` (default: the newest committed) and return the version held, trying every route the
        manifest offers around bad files. `max_age`: how old a listing of the bucket may answer (0: listed now).

        Raises (only `DeltaError`s, whatever the bucket holds):
            UntrustedVersionError: a version on the way is not the trusted key's (the state holds the one before it).
            NoPathError: no route around the bad files (the state is untouched).
            BucketUnreachableError, StorageError: the bucket failed.
            DeltaFormatError: no manifest in the bucket parses.
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
                error = StorageError(f"{type(e).__name__}: {e}", url=self.bucket.url)
                self._record(error)
                raise error from e

    def start(self) -> None:
        """Follow the bucket in a daemon thread. No failure ends it: each is counted in `status()` and the step is tried
        again after a back-off; a refused version is no failure."""
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

    def backoff(self) -> Backoff:
        """The waits of the follow loop (`start`), from `config`: what a subscriber at rest costs the bucket."""
        c = self.config
        assert c.poll_interval is not None  # resolved against the bucket's budget
        return Backoff(c.poll_interval, c.max_backoff, c.idle_poll_max, after_change=c.version_interval)

    def _follow(self) -> None:
        c = self.config
        backoff = self.backoff()
        while not self._stop.is_set():
            with self._sync_lock:
                seen = (self._latest, self._reader.version)
                try:
                    self._catch_up(None, c.poll_interval or 0.0)
                    backoff.succeeded(changed=(self._latest, self._reader.version) != seen)
                except UntrustedVersionError:  # counted by `_catch_up`; the trainer's next version is awaited
                    backoff.succeeded(changed=True)
                except (DeltaError, OSError) as e:  # a rate limit too: the next look waits for the time it names
                    self._record(e)
                    backoff.failed(e)
                except Exception as e:  # anything else (a bug, MemoryError, ...): recorded and retried, never fatal
                    logger.exception("subscriber on %s: unexpected failure, retrying", self.bucket.url)
                    self._record(e)
                    backoff.failed(e)
            backoff.wait(self._stop)

    def _record(self, error: BaseException) -> None:
        self._failures += 1
        self._last_error = printable(f"{type(error).__name__}: {error}")  # what a file put in it, escaped
        logger.warning("subscriber on %s: %s", self.bucket.url, self._last_error)

    def _refused_manifest(self, error: DeltaError) -> None:
        """A newest manifest that does not parse: counted, and warned about once (it is skipped at every poll)."""
        self._manifests_refused += 1
        text = printable(str(error))
        if text != self._refused:
            self._refused = text
            logger.warning("subscriber on %s: skipping a manifest: %s", self.bucket.url, text)

    def _catch_up(self, version: int | None, max_age: float = 0.0) -> int | None:
        """Catch up to `version` (None: the newest); `max_age`: how old a listing of the bucket this process made may
        be to list the manifests from (the follow loop's poll; 0 for `sync`)."""
        seen_at = time.monotonic()
        self._reader.trust = self.trust
        self._manifests_refused = 0
        manifest = newest_manifest(self.bucket, on_refused=self._refused_manifest, max_age=max_age)
        if manifest is None or manifest.latest is None:
            return self._reader.version
        followed = False  # past the rollback check: this manifest's newest may be reported
        try:
            if version is None:
                self._not_older(manifest)
            followed = True
            self._latest = self._signed_latest(manifest)
            target = manifest.latest.version if version is None else version
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
        finally:
            if followed:  # a key trusted on first use during the catch-up now vouches for it
                self._latest = self._signed_latest(manifest)

    def _signed_latest(self, manifest: Manifest) -> int | None:
        """The newest version to report: `manifest`'s newest if the trusted key signed it (`Trust.vouches`), else the
        newest of the one reported before and the one held (a forged entry's number is no version of the trainer's)."""
        latest = manifest.latest
        assert latest is not None  # a manifest with versions
        if self.trust.vouches(latest, manifest):
            return latest.version
        return max((v for v in (self._latest, self._reader.version) if v is not None), default=None)

    def _not_older(self, manifest: Manifest) -> None:
        """Refuse a newest manifest that ends before what a reader of the bucket applied (`Seen.check`: an older
        manifest committed again), its signature checked first (a forged one is refused as what it is).

        Raises:
            UntrustedVersionError: reason "rollback", or the signature's.
        """
        latest = manifest.latest
        assert latest is not None  # a manifest with versions
        try:
            self.trust.seen.check(latest, f"the newest manifest ({manifest.path})")
        except UntrustedVersionError as rollback:
            self.trust.check_version(latest, manifest)
            raise rollback from None

    def _refuse(self, error: UntrustedVersionError, commit: int) -> None:
        """Count a version refused, once per manifest that offers it (it is polled again and again), and say why."""
        if self._refused_at == (commit, error.version, error.reason):
            return
        self._refused_at = (commit, error.version, error.reason)
        self._refusals += 1
        self._last_refusal = printable(str(error))
        logger.warning("subscriber on %s: REFUSED %s", self.bucket.url, self._last_refusal)

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
        self.trust.seen.applied(applied.entry)
        if self.on_update is not None:
            try:
                self.on_update(
                    Update(applied.entry.version, applied.changed, stats, applied.headers, applied.entry.published_at)
                )
            except Exception:  # the consumer's bug must not stop the follower
                logger.exception("on_update callback failed for version %d", applied.entry.version)
