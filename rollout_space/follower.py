"""Keeps an engine at the trainer's newest published version.

A `delta.Subscriber` follows the bucket in a background thread and decodes each version into the engine's
published state while the engine serves; a loader thread then waits for the batch in flight to end and pushes
the changed tensors with `Engine.update`, the only step that holds generation off. Versions that arrive during
one batch are loaded together after it. A bad file, an unreachable bucket or a version the trainer did not sign
leaves the engine serving its last good version, and shows in `status()`."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import delta
from delta import DeltaHeader, Storage, SubscriberConfig, Update
from wire.lora import LoraSettings, kept_versions_refusal

from .engines import Engine
from .engines.errors import EngineError, UpdateRefusedError
from .errors import LoraRefusedError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncRecord:
    """How one version reached the engine: `via` delta or anchor, the bytes read, the seconds fetching and decoding
    (generation went on), waiting for the batch in flight (`wait_s`), and with generation held off while loading
    (`pause_s`); `lag_s` from the trainer's publish to serving it (None if the manifest has no publish time)."""

    version: int
    via: str
    bytes_fetched: int
    fetch_s: float
    decode_s: float
    wait_s: float
    pause_s: float
    lag_s: float | None
    changed_tensors: int
    at: float


def run_refusal(
    lora: LoraSettings | None, keep: int, *, base_hash: str, followed: LoraSettings | None, held: int | None
) -> tuple[str, str] | None:
    """Why a server does not follow the run whose settings name `lora` and `keep` (its staleness + 1): the kind
    (`errors.REFUSALS`) and one line saying what to change; None if it may. `base_hash` is the server's model's,
    `followed` the run it follows now, `held` the version of it served.

    A bucket's versions are full weights or one adapter for good: a run that switches while the server serves one
    of its versions is not followed (it would drop that version for the base at version 0)."""
    if lora is not None and lora.base_hash != base_hash:
        return (
            "another base",
            (
                f"the run trains a LoRA adapter on base {lora.base_hash} ({lora.base_model}); this "
                f"server's model hashes to {base_hash}: start it with the run's base model"
            ),
        )
    if lora is not None and lora.sync == "adapter" and (too_many := kept_versions_refusal(keep)):
        return "too many versions", too_many
    if held is not None and _published(lora) != _published(followed):
        return (
            "mode switch",
            (
                f"the run now publishes {_described(lora)}, but this server serves version {held} of "
                f"the bucket, which holds {_described(followed)}: a bucket's versions keep their kind, so version "
                f"{held} stays served (a run of another kind starts on a new bucket)"
            ),
        )
    return None


def _published(lora: LoraSettings | None) -> tuple[int, float, tuple[str, ...]] | None:
    """What the bucket's versions are under the run's settings `lora`: an adapter (rank, alpha, targets), or None for
    full weights (a merged adapter's versions are full weights too)."""
    return None if lora is None or lora.sync != "adapter" else (lora.r, lora.alpha, lora.targets)


def _described(lora: LoraSettings | None) -> str:
    """`_published(lora)` in a few words."""
    if lora is None or _published(lora) is None:
        return "full weights"
    return f"a LoRA adapter of rank {lora.r}, alpha {lora.alpha:g} on {', '.join(lora.targets)}"


class Follower:
    """Follows a bucket for an engine. `start()` begins, `close()` stops; `status()` reports.

    Args:
        engine: The engine to keep current; its published state is updated in place.
        bucket: The server's `delta.Bucket` (shared with the reader of the run's settings: one trust, one listing),
            or a URL.
        config: The subscriber's polling settings.
        history: Sync records kept.

    Reads the bucket's manifest once, and hashes the engine's model, to start from the version it holds.
    """

    def __init__(
        self,
        engine: Engine,
        bucket: delta.Bucket | str,
        config: SubscriberConfig | None = None,
        history: int = 200,
    ) -> None:
        self.engine = engine
        self.bucket = delta.Bucket.of(bucket)
        self.trust = self.bucket.trust
        base = delta.state_digest(engine.state)
        #: The state hash of the engine's model as loaded: a LoRA run on another base is refused (`adopt`).
        self.base_hash = base.hexdigest
        self.lora: LoraSettings | None = None  # the LoRA run followed (`adopt`)
        #: Why the last run read was refused (`adopt`), shown as `status()`'s last error; None once one is followed.
        self.refusal: str | None = None
        #: Refusals so far by kind (`errors.REFUSALS`): a run refused counts once, however often it is read again.
        self.refused: Counter[str] = Counter()
        self._refused_run: tuple[LoraSettings | None, int] | None = None  # the run and keep refused last
        version, digest = self._version_of_model(base)
        if version is not None:
            engine.update({}, version)
        self._config = config
        self._started = False
        self._subscriber = delta.Subscriber(
            self.bucket, engine.state, version=version, digest=digest, config=config, on_update=self._queue
        )
        self._refused_before = 0  # versions refused by the subscribers replaced (`_follow_anew`)
        self._records: deque[SyncRecord] = deque(maxlen=history)
        self._last_header: DeltaHeader | None = None
        self._lock = threading.Lock()
        self._engine_error: str | None = None
        # Versions decoded into the state and not yet loaded into the engine, with when each arrived.
        self._pending: list[tuple[Update, float]] = []
        self._arrived = threading.Condition()
        self._closing = False
        self._hold = threading.RLock()  # held by `holding` and by every load: no load while a caller holds it
        self._holder = threading.local()  # `depth`: how many `holding` blocks this thread is inside
        self._loader = threading.Thread(target=self._load_forever, name="follower-load", daemon=True)

    @property
    def poll_s(self) -> float:
        """Seconds between the subscriber's looks while versions come (the config's, else the bucket's budget)."""
        return self._subscriber.config.poll_interval or self.bucket.budget.poll_s

    @property
    def storage(self) -> Storage:
        """The bucket followed (its `traffic` is what the server's requests to it cost)."""
        return self.bucket.storage

    @property
    def decoded_version(self) -> int | None:
        """The version written into the published state: ahead of `engine.version` while the engine
        finishes the batch in flight (None before the first)."""
        return self._subscriber.version

    def _version_of_model(self, digest: delta.StateDigest) -> tuple[int | None, delta.StateDigest | None]:
        """The newest version of the bucket whose state hash is the model's and whose signature the trust takes, if any
        (no anchor to fetch then), with the model's digest; an unreachable bucket is not fatal here (the follower
        retries)."""
        try:
            manifest = delta.read_manifest(self.bucket)
        except (delta.DeltaError, OSError) as e:
            logger.warning("cannot read the manifest of %s yet (%s); will retry", self.bucket.url, e)
            return None, None
        if manifest is None:
            return None, None
        for entry in reversed(manifest.versions):
            if entry.state_hash != digest.hexdigest:
                continue
            try:  # the version named is only one the trainer signed: a forged entry's hash claims nothing
                self.trust.check_version(entry, manifest)
            except delta.UntrustedVersionError as e:
                logger.warning("not naming the model version %d of %s: %s", entry.version, self.bucket.url, e)
                continue
            return entry.version, digest
        return None, None

    def start(self) -> None:
        """Follow the bucket in a background thread, and load what it decodes in another."""
        self._started = True
        self._loader.start()
        self._subscriber.start()

    def adopt(self, lora: LoraSettings | None, keep: int = 1) -> None:
        """Follow the published state the run's settings name (`RunSettings.lora`), without a restart; cheap when
        nothing changed.

        A run in adapter mode makes the engine serve the adapter (`Engine.serve_adapter`) and the follower follow its
        tensors from the newest anchor; leaving adapter mode restores the base and follows the full weights. A version
        decoded but not loaded yet is dropped.

        Raises:
            LoraRefusedError: a run this server does not follow (`run_refusal`, `Engine.adapter_refusal`): nothing
                changed, and it is counted once per run in `refused`. Or the engine failed to build the adapter: it then
                serves the base at version 0, and the next call tries again.
        """
        refusal = run_refusal(lora, keep, base_hash=self.base_hash, followed=self.lora, held=self._subscriber.version)
        adapter = lora if lora is not None and lora.sync == "adapter" else None
        if refusal is None and adapter is not None and lora != self.lora:
            refusal = self.engine.adapter_refusal(adapter)
        try:
            if refusal is not None:
                raise LoraRefusedError(refusal[1], refusal[0])
            if lora != self.lora:
                self._adopt(lora, adapter)
        except LoraRefusedError as e:
            if self.refusal is None or (lora, keep) != self._refused_run:
                self.refused[e.reason] += 1
                logger.warning("refused the run: %s", e)
            self.refusal, self._refused_run = str(e), (lora, keep)
            raise
        self.engine.keep_versions = keep
        self.refusal, self._refused_run = None, None

    def _adopt(self, lora: LoraSettings | None, adapter: LoraSettings | None) -> None:
        """`adopt`'s work, for a run other than the one followed that this server can follow."""
        if adapter is not None or (self.lora is not None and self.lora.sync == "adapter"):
            self._follow_anew(adapter)
        self.lora = lora
        logger.info("following the run's %s", f"LoRA adapter ({lora.sync} mode, r={lora.r})" if lora else "weights")

    def _follow_anew(self, adapter: LoraSettings | None) -> None:
        """Switch the engine to `adapter` (None: full weights) and follow its new state from the bucket's anchor."""
        bucket = self.bucket
        self._subscriber.close()
        with self._hold, self.engine.paused():
            with self._arrived:
                self._pending = []
            try:
                self.engine.serve_adapter(adapter)
            except EngineError as e:
                raise LoraRefusedError(f"cannot serve the run's adapter: {e}", "adapter failed") from e
            finally:  # a subscriber on whatever state the engine holds now, refused or not
                self._refused_before += self._subscriber.status().versions_refused
                self._subscriber = delta.Subscriber(
                    bucket, self.engine.state, config=self._config, on_update=self._queue
                )
                with self._lock:
                    self._last_header = None
                if self._started:
                    self._subscriber.start()

    def sync(self) -> int | None:
        """Catch up now, in the caller's thread; returns the version served (None: the bucket is empty and the model is
        not one of its versions). Raises as `delta.Subscriber.sync`; the engine serves the last version reached."""
        try:  # the last poll's listing may answer, if the budget lets a listing be that old
            self._subscriber.sync(max_age=min(self.poll_s, self.bucket.budget.listing_age_s))
        finally:
            self._load_pending()
        return self._subscriber.version

    @property
    def latest(self) -> int | None:
        """The newest version the bucket has published, as last polled (None: none seen yet)."""
        return self._subscriber.status().latest

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the engine on the version it serves while inside (an exam is of one version); new versions are still
        decoded meanwhile and loaded once the holder leaves. Re-entrant; other threads' holders wait."""
        with self._hold:
            self._holder.depth = getattr(self._holder, "depth", 0) + 1
            try:
                yield
            finally:
                self._holder.depth -= 1

    def close(self, timeout: float = 30.0) -> bool:
        """Stop following; a version decoded but not loaded yet is dropped. Waits up to `timeout` s for a version
        being fetched, decoded or loaded; True if both threads ended (else one runs on: a daemon)."""
        deadline = time.monotonic() + timeout
        self._subscriber.close(timeout)
        with self._arrived:
            self._closing = True
            self._arrived.notify_all()
        if self._loader.is_alive():
            self._loader.join(max(0.0, deadline - time.monotonic()))
        return not self._loader.is_alive() and time.monotonic() < deadline

    def _queue(self, update: Update) -> None:
        """Runs in the subscriber's thread after each version is written into the published state: hand
        it to the loader and go on polling and decoding (never wait for the batch in flight here)."""
        with self._arrived:
            self._pending.append((update, time.perf_counter()))
            self._arrived.notify_all()

    def _load_forever(self) -> None:
        """The loader thread: load each batch of queued versions once the generation in flight ends."""
        while True:
            with self._arrived:
                self._arrived.wait_for(lambda: self._pending or self._closing)
                if self._closing:
                    return
            try:
                self._load_pending()
            except EngineError as e:  # interrupted: the server is exiting, and loads nothing more
                logger.info("stopped loading new weights: %s", e)
                return

    def _load_pending(self) -> None:
        """Load every queued version into the engine in one update: the union of their changed tensors, read from the
        state at the newest. Holds generation and the subscriber's writes off meanwhile; loads nothing while a caller
        is `holding`."""
        if getattr(self._holder, "depth", 0):
            return
        while not self._hold.acquire(timeout=0.5):
            if self._closing:
                return
        try:
            self._load_held()
        finally:
            self._hold.release()

    def _load_held(self) -> None:
        """`_load_pending`'s work, `_hold` held."""
        with self.engine.paused(), self._subscriber.lock:  # the batch in flight ends; then a pause
            taken = self._take_pending()
            if not taken:
                return
            start = time.perf_counter()
            newest = taken[-1][0]
            names = sorted({n for update, _ in taken for n in update.changed})
            try:
                self.engine.update({n: self.engine.state[n] for n in names}, newest.version)
            except Exception as e:  # the engine refused or broke: keep the error visible, keep following
                self._engine_error = f"{type(e).__name__}: {e}"
                if isinstance(e, UpdateRefusedError) and self.lora is not None and self.lora.sync == "adapter":
                    self.refused["bad adapter"] += 1
                logger.exception("engine did not take version %d", newest.version)
                return
            pause = time.perf_counter() - start
        now = time.time()
        records = []
        for update, arrived in taken:
            stats = update.stats
            records.append(
                SyncRecord(
                    update.version,
                    stats.via,
                    stats.bytes_fetched,
                    stats.fetch_s,
                    stats.decode_s + stats.apply_pause_s,
                    max(0.0, start - arrived),
                    pause,
                    None if update.published_at is None else max(0.0, now - update.published_at),
                    len(update.changed),
                    now,
                )
            )
        with self._lock:
            self._engine_error = None
            self._records.extend(records)
            if newest.headers:
                self._last_header = DeltaHeader.merged(newest.headers)

    def _take_pending(self) -> list[tuple[Update, float]]:
        """The queued versions, once the newest of them is the version the state holds (call holding the
        subscriber's lock, so no write comes in between); empty when there are none or on close."""
        with self._arrived:
            # Its subscriber may be between writing the newest version and queueing it: `_queue` notifies.
            self._arrived.wait_for(
                lambda: self._closing or not self._pending or self._pending[-1][0].version == self._subscriber.version
            )
            if self._closing:
                return []
            taken, self._pending = self._pending, []
            return taken

    def records(self) -> list[SyncRecord]:
        """The latest syncs, oldest first."""
        with self._lock:
            return list(self._records)

    def last_header(self) -> DeltaHeader | None:
        """The header of the last delta applied (ranks merged), or None (nothing yet, or an anchor)."""
        with self._lock:
            return self._last_header

    def status(self) -> dict[str, object]:
        """`latest_version`, `lag`, `last_error`, `failures`, `refused` (by kind), `last_refusal`, `trust`,
        `authenticated`, and `state_hash`: the manifest's hash of the state served (None while the state decoded is not
        the one served)."""
        status = self._subscriber.status()
        lag = None if status.latest is None else max(0, status.latest - self.engine.version)
        digest = self._subscriber.digest
        served = digest is not None and self._subscriber.version == self.engine.version
        refused = dict(self.refused)
        if status.versions_refused or self._refused_before:
            refused["untrusted version"] = status.versions_refused + self._refused_before
        return {
            "latest_version": status.latest,
            "lag": lag,
            "failures": status.failures,
            "last_error": self._engine_error or self.refusal or status.last_error,
            "refused": refused,
            "last_refusal": status.last_refusal,
            "trust": status.trust,
            "authenticated": status.authenticated,
            "state_hash": digest.hexdigest if served and digest is not None else None,
        }
