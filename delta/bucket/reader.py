"""Read a bucket's versions into a state, bit for bit: the catch-up that the `Subscriber` follows a bucket
with and the `Publisher` resumes from.

Each version's signature is checked first, when the reader is given a `Trust` (`trust`: the trainer's key, nothing
fetched for a version it did not sign); then it is fetched, verified (size and SHA-256 of every file against the
manifest) and decoded against the current state without touching it; only then is it written, under `lock` — the only
pause a consumer sees. A file that fails its check is fetched once more, then avoided: the route is
planned again through an anchor (`catchup.plan`). Nothing partial is ever written and the version
never advances on a failure.

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

from ..codecs import Workspace
from ..errors import DeltaError, DeltaFormatError, IntegrityError, StateMismatchError, printable
from ..format import DeltaHeader
from ..patch.apply import Rollback, decode, write_changes
from ..storage import Storage, check_path
from ..tensors.hashing import StateDigest, digest_like, scheme_of
from ..tensors.state import State, check_same_layout
from . import pieces
from ._whole import check_step
from .anchors import decode_anchor
from .catchup import Step, plan
from .manifest import FileRef, Manifest, VersionEntry, fetch_verified
from .trust import Trust

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """One version a `Reader` wrote.

    Attributes:
        entry: The manifest's entry of the version now held.
        via: "delta" or "anchor".
        changed: Names of the tensors written (every tensor after an anchor).
        headers: The headers of the delta files applied (one per rank; empty after an anchor).
        bytes_fetched: Bytes read from the bucket for it (refetches included).
        fetch_s: Seconds fetching and verifying its files.
        decode_s: Seconds decoding and validating them (the state untouched meanwhile).
        pause_s: Seconds the state was locked for writing.
    """

    entry: VersionEntry
    via: str
    changed: tuple[str, ...]
    headers: tuple[DeltaHeader, ...]
    bytes_fetched: int
    fetch_s: float
    decode_s: float
    pause_s: float


class BadFiles(DeltaError):
    """A step cannot be used: its files (`paths`) are to be avoided, and the route planned again."""

    def __init__(self, paths: list[str], cause: Exception) -> None:
        super().__init__(printable(f"cannot use {paths}: {type(cause).__name__}: {cause}"))
        self.paths = paths


@dataclass
class _Prepared:
    step: Step
    payload: Any  # (base digest, per delta file (header, changes, sub-state, its digest)); (fresh state, digest, full
    # state) for an anchor
    fetched: int
    fetch_s: float
    decode_s: float


class Reader:
    """Holds a state and the version of a bucket it equals; `catch_up` moves it to another version.

    Args:
        storage: The bucket.
        state: Tensors to update in place (contiguous; on the CPU or a GPU: see `delta.apply`). None: the
            first anchor becomes the state (on the CPU).
        version: The version `state` holds, if known (checked against the manifest's hashes); None
            means unknown, so the first step loads an anchor into `state`.
        fetch_threads: Files of one step fetched in parallel (anchor shards, one delta per rank).
        workers: Threads that decode chunks (None: one per core).
        trust: Whose versions to apply (`Trust.check_version`, before each step); None: every version the manifest
            lists (a publisher resuming from versions it checked were its own).

    Threads: `catch_up` runs in the caller's thread (one caller at a time); decoding reads the state while
    others may read it too; every write into it happens under `lock`, and `wait_for` wakes when the
    version changes.
    """

    def __init__(
        self,
        storage: Storage,
        state: State | None = None,
        *,
        version: int | None = None,
        digest: StateDigest | None = None,
        fetch_threads: int = 4,
        workers: int | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.storage = storage
        self.workers = workers
        self.trust = trust
        self._run: str | None = None  # the run of the version held, once one is applied (a signed bucket's)
        self.lock = threading.RLock()
        self._state = state  # what files name: tensors and pieces (views of `_full`'s tensors when sharded)
        self._full = state  # what callers see: full tensors
        self._layout: pieces.Layout = {}
        self._version = version if state is not None else None
        # The state's digest: the caller's, or hashed at the first catch-up; either way in the bucket's scheme.
        self._digest: StateDigest | None = digest if self._version is not None else None
        self._advanced = threading.Condition()  # notified each time `_version` changes (`wait_for` waits on it)
        self._pool = ThreadPoolExecutor(fetch_threads, thread_name_prefix="delta-fetch")
        self._workspace = Workspace()  # the decoder's memory kept from one file to the next (one catch-up at a time)

    @property
    def state(self) -> State | None:
        """The held state, full tensors (updated in place; an anchor loaded into an empty reader replaces None)."""
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
        """The digest of the state at `version`, kept by the files' names (`flat_state`); its `hexdigest` is the
        state hash, the same whole or in pieces. None before the first catch-up."""
        return self._digest

    def _keys(self, flat: State) -> dict:
        """State-hash keys of the pieces in `flat` (the others are their own full tensors)."""
        return pieces.hash_keys(flat, pieces.record_of(self._layout))

    def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until the state holds `version` or newer; False after `timeout` seconds."""
        with self._advanced:
            return self._advanced.wait_for(lambda: (self._version or 0) >= version, timeout)

    def close(self) -> None:
        """Release the fetch threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def catch_up(
        self,
        manifest: Manifest,
        target: int,
        *,
        stopped: Callable[[], bool] = lambda: False,
        on_bad_files: Callable[[BadFiles], None] | None = None,
        on_applied: Callable[[Applied], None] | None = None,
    ) -> int | None:
        """Move the state to version `target` of `manifest`, step by step; returns the version held.

        Args:
            stopped: Checked before each step: True ends the catch-up where it is.
            on_bad_files: Told of each step whose files were bad (then avoided, and the route planned again).
            on_applied: Told of each version written (outside `lock`).

        Raises:
            NoPathError: no route around the bad files (the state is untouched at its last version).
            UntrustedVersionError: a step's version is not the trusted key's (`trust`): the state stays at the
                version before it, and nothing of it was fetched.
        """
        self.adopt_layout(manifest.pieces or {})
        held = manifest.get(self._version) if self._version is not None else None
        if (
            self._state is not None
            and self._version is not None
            and (self._digest is None or (held is not None and scheme_of(held.state_hash) != self._digest.scheme))
        ):
            # hashed in the scheme of the version held (the state is only read: no lock)
            digest = digest_like(held.state_hash if held else "", self._state, self._keys(self._state), self.workers)
            with self.lock:
                self._digest = digest
        avoid: set[str] = set()
        route: deque[Step] = deque()  # planned once, and again only after bad files: planning is O(manifest)
        while self._version != target and not stopped():
            if not route:
                have_hash = self._digest.hexdigest if self._digest is not None else None
                route.extend(plan(manifest, target, have=self._version, have_hash=have_hash, avoid=avoid))
            step = route.popleft()
            if self.trust is not None:
                self.trust.check_version(step.entry, manifest, self._run)
            try:
                applied = self._apply(self._prepare(step, manifest))
            except BadFiles as e:
                if on_bad_files is not None:
                    on_bad_files(e)
                avoid.update(e.paths)
                route.clear()
                continue
            if on_applied is not None:
                on_applied(applied)
        return self._version

    def adopt_layout(self, layout: pieces.Layout) -> None:
        """Read and write the held state through the pieces `layout` names (a sharded writer's, or none)."""
        if layout == self._layout:
            return
        if self._full is not None:
            flat = pieces.piece_views(self._full, layout) if layout else self._full
            with self.lock:
                self._state = flat
                self._layout = layout
                if self._digest is not None:
                    self._digest = digest_like(self._digest.hexdigest, flat, self._keys(flat), self.workers)
        self._layout = layout

    # -- one step: fetch + decode (no lock), then write (lock) ---------------------------------------

    def _fetch(self, ref: FileRef) -> tuple[bytes, int]:
        """Fetch and verify one file, once more if it fails; returns (data, bytes read)."""
        _check_path(ref)
        try:
            return fetch_verified(self.storage, ref), ref.size
        except (IntegrityError, FileNotFoundError) as first:
            logger.warning("%s", printable(f"{ref.path}: {first}; fetching it again"))
            try:
                return fetch_verified(self.storage, ref), 2 * ref.size
            except (IntegrityError, FileNotFoundError) as e:
                raise BadFiles([ref.path], e) from e

    def _prepare(self, step: Step, manifest: Manifest) -> _Prepared:
        _check_whole(step, manifest, self._state)
        start = time.perf_counter()
        results = list(self._pool.map(self._fetch, step.files))
        fetched = sum(n for _, n in results)
        decoded = time.perf_counter()
        datas = [data for data, _ in results]
        try:
            payload = (
                self._decode_anchor(step, datas) if step.via == "anchor" else self._decode_deltas(step, datas, manifest)
            )
        except (DeltaFormatError, StateMismatchError, IntegrityError) as e:
            raise BadFiles([f.path for f in step.files], e) from e
        return _Prepared(step, payload, fetched, decoded - start, time.perf_counter() - decoded)

    def _decode_anchor(self, step: Step, datas: list[bytes]) -> tuple[State, StateDigest, State | None]:
        fresh: State = {}
        for rank in sorted({f.rank for f in step.files}):  # each rank's shards make one anchor of its tensors
            mine = [(f.path, data) for f, data in zip(step.files, datas, strict=True) if f.rank == rank]
            part = decode_anchor([d for _, d in mine], version=step.entry.version, paths=[p for p, _ in mine])
            if fresh.keys() & part.keys():
                raise DeltaFormatError(f"rank {rank}'s anchor repeats tensors of another rank", path=mine[0][0])
            fresh.update(part)
        digest = digest_like(step.entry.state_hash, fresh, self._keys(fresh), self.workers)
        if digest.hexdigest != step.entry.state_hash:
            raise IntegrityError(
                f"anchor of version {step.entry.version} does not hash to the manifest's state hash",
                expected=step.entry.state_hash,
                actual=digest.hexdigest,
            )
        if self._state is not None:
            check_same_layout(self._state, fresh)
            return fresh, digest, None
        full = pieces.assemble(fresh, self._layout) if self._layout else fresh
        return fresh, digest, full

    def _base_digest(self, entry: VersionEntry) -> StateDigest:
        """The held state's digest in the scheme the step's base is hashed in: the one held, or (a format-3 delta
        straight after a format-2 version) the state hashed afresh in the new scheme, read only, so that every
        file is proven in its own scheme before the first write."""
        assert self._digest is not None and self._state is not None  # a delta step follows a held version
        if entry.base_hash is None or scheme_of(entry.base_hash) == self._digest.scheme:
            return self._digest
        return digest_like(entry.base_hash, self._state, self._keys(self._state), self.workers)

    def _decode_deltas(self, step: Step, datas: list[bytes], manifest: Manifest) -> tuple[StateDigest, list[tuple]]:
        """Every file of a delta step decoded and proven against the held state, in the scheme its base is hashed
        in; no tensor in two files (each file is proven against the same old state, so two writes of one tensor
        would not add up). Returns the held state's digest in that scheme, and each file's decoded parts."""
        base = self._base_digest(step.entry)
        assert self._state is not None  # as `_base_digest` found it
        out: list[tuple] = []
        written: set[str] = set()
        for ref, data in zip(step.files, datas, strict=True):
            names = manifest.shards[ref.rank] if manifest.shards is not None else sorted(self._state)
            sub = {n: self._state[n] for n in names}
            sub_digest = base.subset(names)
            header, changes, proven = decode(
                data, sub, path=ref.path, digest=sub_digest, workers=self.workers, workspace=self._workspace
            )
            if proven is None or proven.scheme != base.scheme:
                raise DeltaFormatError(
                    f"hashes its base in another scheme than its manifest ({base.scheme})", path=ref.path
                )
            twice = written & {c.name for c in changes}
            if twice:
                raise DeltaFormatError(
                    f"changes {sorted(twice)[0]!r} that another file of version {step.entry.version} changes too",
                    path=ref.path,
                )
            written |= {c.name for c in changes}
            if manifest.shards is None and header.target_hash != step.entry.state_hash:
                # One writer: the file's target must be the version's state, checked before any write.
                raise IntegrityError(
                    f"{ref.path} leads to another state than version {step.entry.version}",
                    expected=step.entry.state_hash,
                    actual=header.target_hash,
                    path=ref.path,
                )
            out.append((header, changes, sub, proven))
        return base, out

    def _apply(self, prepared: _Prepared) -> Applied:
        entry = prepared.step.entry
        with self.lock:
            start = time.perf_counter()
            if prepared.step.via == "anchor":
                fresh, digest, full = prepared.payload
                if self._state is None:
                    self._full = full
                    self._state = pieces.piece_views(full, self._layout) if self._layout else full
                else:
                    assert self._full is not None  # held with the state
                    for name, tensor in fresh.items():
                        self._state[name].copy_(tensor)
                    pieces.write_back(self._full, self._state, self._layout)
                assert self._full is not None
                changed = tuple(sorted(self._full))
                headers: tuple[DeltaHeader, ...] = ()
            else:
                base, decoded = prepared.payload
                try:
                    digest, changed = self._write_deltas(base, decoded, entry.state_hash)
                except IntegrityError as e:
                    raise BadFiles([f.path for f in prepared.step.files], e) from e
                headers = tuple(header for header, *_ in decoded)
            self._digest, self._version, self._run = digest, entry.version, entry.run
            pause = time.perf_counter() - start
            with self._advanced:
                self._advanced.notify_all()
        return Applied(
            entry, prepared.step.via, changed, headers, prepared.fetched, prepared.fetch_s, prepared.decode_s, pause
        )

    def _write_deltas(
        self, base: StateDigest, decoded: list[tuple], state_hash: str
    ) -> tuple[StateDigest, tuple[str, ...]]:
        """Write every rank's changes, all or nothing: earlier ranks are rolled back if a later one fails.

        Args:
            base: The held state's digest in the files' scheme (`_decode_deltas`).

        Raises:
            IntegrityError: a rank's result or the whole state does not hash as recorded (state restored).
        """
        assert self._full is not None and self._state is not None  # a delta step follows a held version
        digest = base
        rollback = Rollback()
        changed: set[str] = set()
        try:
            for header, changes, sub, sub_digest in decoded:
                result = write_changes(header, changes, sub, sub_digest, rollback)
                digest = digest.merged(result.digest)  # moved by what was written, from what was there
                changed.update(c.name for c in changes)
            if digest.hexdigest != state_hash:
                raise IntegrityError(
                    "state after applying does not match the manifest's state hash",
                    expected=state_hash,
                    actual=digest.hexdigest,
                )
        except BaseException:  # a mismatch, or anything that stopped the writes half way: undo them all
            rollback.restore()
            raise
        pieces.write_back(self._full, self._state, self._layout, changed)
        owner = pieces.owners(self._layout)
        return digest, tuple(sorted({owner.get(n, n) for n in changed}))


def _check_path(ref: FileRef) -> None:
    """A path the bucket refuses (absolute, '..', control characters) makes its file a bad one, routed around
    like a missing one."""
    try:
        check_path(ref.path)
    except ValueError as e:
        raise BadFiles([ref.path], e) from e


def _check_whole(step: Step, manifest: Manifest, state: State | None) -> None:
    """Before anything is fetched: a step whose files would write tensors the state lacks is a bad step."""
    if step.via != "delta":
        return
    try:
        check_step(step.files, manifest.shards, state)
    except StateMismatchError as e:
        raise BadFiles([f.path for f in step.files], e) from e
