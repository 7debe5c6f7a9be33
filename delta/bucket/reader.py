"""Read a bucket's versions into a state, bit for bit: the catch-up a `Subscriber` follows a bucket with and a trainer
resumes from.

`Reader.catch_up` plans the cheapest route (`catchup.plan`), then per step verifies it (the trainer's signature, and
that its files fit the state), fetches its files (checked against the manifest), decodes them without touching the
state, and only then writes, under `lock`. A file that fails is fetched once more, then avoided through an anchor.
Nothing partial is ever written. Sharded writers' pieces are read and written through views of their full tensors."""

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
from ..errors import DeltaError, DeltaFormatError, IntegrityError, StateMismatchError, UntrustedVersionError, printable
from ..format import DeltaHeader
from ..patch.apply import Rollback, decode, write_changes
from ..storage import check_path
from ..tensors.hashing import StateDigest, state_digest
from ..tensors.state import State, check_same_layout
from . import pieces
from ._files import Files
from ._whole import check_step
from .anchors import decode_anchor
from .catchup import Step, plan
from .manifest import FileRef, Manifest, VersionEntry, fetch_verified
from .trust import Trust

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """One version a `Reader` wrote: its manifest `entry`, `via` "delta" or "anchor", the tensors `changed`, the delta
    files' `headers`, the bytes read, and the seconds fetching, decoding and with the state locked (`pause_s`)."""

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
class _Fetched:
    datas: list[bytes]
    bytes: int
    seconds: float


@dataclass
class _Anchor:
    """An anchor step decoded: its tensors by file name, their digest, and the full state (an empty reader's)."""

    fresh: State
    digest: StateDigest
    full: State | None


@dataclass
class _Deltas:
    """A delta step decoded: per file (header, changes, the sub-state it writes, that sub-state's digest)."""

    files: list[tuple[Any, ...]]


class Reader:
    """Holds a state and the version of a bucket it equals; `catch_up` moves it to another version.

    Args:
        files: The bucket (`delta.Bucket`).
        state: Tensors to update in place (contiguous; CPU or GPU). None: the first anchor becomes the state.
        version: The version `state` holds, if known (checked against the manifest's hashes); None: the first step
            loads an anchor.
        digest: `state`'s digest, if the caller has it (None: hashed at the first catch-up).
        fetch_threads: Files of one step fetched in parallel (anchor shards, one delta per rank).
        workers: Threads that decode chunks (None: one per core).
        trust: Whose versions to apply (`Trust.check_version`); None: every version listed.

    Threads: `catch_up` runs in the caller's thread (one at a time); every write into the state happens under `lock`,
    and `wait_for` wakes when the version changes.
    """

    def __init__(
        self,
        files: Files,
        state: State | None = None,
        *,
        version: int | None = None,
        digest: StateDigest | None = None,
        fetch_threads: int = 4,
        workers: int | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.files = files
        self.workers = workers
        self.trust = trust
        self._run: str | None = None  # the run of the version held, once one is applied (a signed bucket's)
        self.lock = threading.RLock()
        self._state = state  # what files name: tensors and pieces (views of `_full`'s tensors when sharded)
        self._full = state  # what callers see: full tensors
        self._layout: pieces.Layout = {}
        self._version = version if state is not None else None
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
        """The state as the files name it: the pieces of sharded tensors under piece names (views of `state`'s
        tensors where contiguous), the other tensors as in `state`."""
        return self._state

    @property
    def version(self) -> int | None:
        return self._version

    @property
    def digest(self) -> StateDigest | None:
        """The digest of the state at `version`, by the files' names (`flat_state`); its `hexdigest` is the state
        hash, the same whole or in pieces. None before the first catch-up."""
        return self._digest

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
        """Move the state to version `target` of `manifest`, step by step; returns the version held. `stopped` is
        checked before each step; `on_bad_files` is told of steps avoided, `on_applied` of each version written (outside
        `lock`).

        Raises:
            NoPathError: no route around the bad files (the state is untouched at its last version).
            UntrustedVersionError: a step's version is not the trusted key's, or the layout is not (checked before the
                state is laid out anew): the state stays at the version before it.
        """
        layout = manifest.pieces or {}
        if layout != self._layout:
            try:
                self._check_layout(manifest, target)
            except UntrustedVersionError:
                self._hash_held()  # a reader at a version reports its state's hash, refused layout or not
                raise
            self.adopt_layout(layout)
        self._hash_held()
        avoid: set[str] = set()
        route: deque[Step] = deque()  # planned once, and again only after bad files: planning is O(manifest)
        while self._version != target and not stopped():
            if not route:
                have_hash = self._digest.hexdigest if self._digest is not None else None
                route.extend(plan(manifest, target, have=self._version, have_hash=have_hash, avoid=avoid))
            step = route.popleft()
            try:
                self._verify(step, manifest)
                fetched = self._fetch(step)
                began = time.perf_counter()
                decoded = self._decode(step, manifest, fetched.datas)
                applied = self._write(step, decoded, fetched, time.perf_counter() - began)
            except BadFiles as e:
                if on_bad_files is not None:
                    on_bad_files(e)
                avoid.update(e.paths)
                route.clear()
                continue
            if on_applied is not None:
                on_applied(applied)
        return self._version

    def _check_layout(self, manifest: Manifest, target: int) -> None:
        """Before the state is re-laid to `manifest`'s pieces: the trainer signed them (each version's signature covers
        the layout), checked on the target version (else the newest), so that a forged layout copies nothing.

        Raises:
            UntrustedVersionError: that version is not the trusted key's (the state is untouched).
        """
        entry = manifest.get(target) or manifest.latest
        # An empty reader copies nothing: its first step (an anchor, checked before it is fetched) vouches for the
        # layout, and a key trusted on first use stays the first version's, not the target's.
        if self.trust is not None and entry is not None and self._full is not None:
            self.trust.check_version(entry, manifest, self._run)

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
                    self._digest = state_digest(flat, self._keys(flat), self.workers)
        self._layout = layout

    def _keys(self, flat: State) -> dict:
        """State-hash keys of the pieces in `flat` (the others are their own full tensors)."""
        return pieces.hash_keys(flat, pieces.record_of(self._layout))

    def _hash_held(self) -> None:
        """Hash the held state once, where the caller gave none (read only: no lock)."""
        if self._state is not None and self._version is not None and self._digest is None:
            digest = state_digest(self._state, self._keys(self._state), self.workers)
            with self.lock:
                self._digest = digest

    # -- one step: verify, fetch, decode (no lock), then write (lock) ----------------------------------

    def _verify(self, step: Step, manifest: Manifest) -> None:
        """Before anything is fetched: the trainer signed the version (else `UntrustedVersionError`), its paths are
        ones a bucket takes, and a delta's files write only tensors the state holds (else `BadFiles`)."""
        if self.trust is not None:
            self.trust.check_version(step.entry, manifest, self._run)
        try:
            for ref in step.files:
                check_path(ref.path)
            if step.via == "delta":
                check_step(step.files, manifest.shards, self._state)
        except (ValueError, StateMismatchError) as e:
            raise BadFiles([f.path for f in step.files], e) from e

    def _fetch(self, step: Step) -> _Fetched:
        start = time.perf_counter()
        results = list(self._pool.map(self._fetch_one, step.files))
        return _Fetched([data for data, _ in results], sum(n for _, n in results), time.perf_counter() - start)

    def _fetch_one(self, ref: FileRef) -> tuple[bytes, int]:
        """Fetch and verify one file, once more (asking the bucket, not the listing kept) if it fails; returns (data,
        bytes read)."""
        try:
            return fetch_verified(self.files, ref, self.files.listed(ref.path)), ref.size
        except (IntegrityError, FileNotFoundError) as first:
            logger.warning("%s", printable(f"{ref.path}: {first}; fetching it again"))
            try:
                return fetch_verified(self.files, ref), 2 * ref.size
            except (IntegrityError, FileNotFoundError) as e:
                raise BadFiles([ref.path], e) from e

    def _decode(self, step: Step, manifest: Manifest, datas: list[bytes]) -> _Anchor | _Deltas:
        try:
            return (
                self._decode_anchor(step, datas) if step.via == "anchor" else self._decode_deltas(step, datas, manifest)
            )
        except (DeltaFormatError, StateMismatchError, IntegrityError) as e:
            raise BadFiles([f.path for f in step.files], e) from e

    def _decode_anchor(self, step: Step, datas: list[bytes]) -> _Anchor:
        fresh: State = {}
        for rank in sorted({f.rank for f in step.files}):  # each rank's shards make one anchor of its tensors
            mine = [(f.path, data) for f, data in zip(step.files, datas, strict=True) if f.rank == rank]
            part = decode_anchor([d for _, d in mine], version=step.entry.version, paths=[p for p, _ in mine])
            if fresh.keys() & part.keys():
                raise DeltaFormatError(f"rank {rank}'s anchor repeats tensors of another rank", path=mine[0][0])
            fresh.update(part)
        digest = state_digest(fresh, self._keys(fresh), self.workers)
        if digest.hexdigest != step.entry.state_hash:
            raise IntegrityError(
                f"anchor of version {step.entry.version} does not hash to the manifest's state hash",
                expected=step.entry.state_hash,
                actual=digest.hexdigest,
            )
        if self._state is not None:
            check_same_layout(self._state, fresh)
            return _Anchor(fresh, digest, None)
        return _Anchor(fresh, digest, pieces.assemble(fresh, self._layout) if self._layout else fresh)

    def _decode_deltas(self, step: Step, datas: list[bytes], manifest: Manifest) -> _Deltas:
        """Every file of a delta step decoded and proven against the held state; no tensor in two files (each file is
        proven against the same old state, so two writes of one tensor would not add up)."""
        assert self._digest is not None and self._state is not None  # a delta step follows a held version
        out: list[tuple[Any, ...]] = []
        written: set[str] = set()
        for ref, data in zip(step.files, datas, strict=True):
            names = manifest.shards[ref.rank] if manifest.shards is not None else sorted(self._state)
            sub = {n: self._state[n] for n in names}
            digest = self._digest.subset(names)
            header, changes, proven = decode(
                data, sub, path=ref.path, digest=digest, workers=self.workers, workspace=self._workspace
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
        return _Deltas(out)

    def _write(self, step: Step, decoded: _Anchor | _Deltas, fetched: _Fetched, decode_s: float) -> Applied:
        entry = step.entry
        headers: tuple[DeltaHeader, ...] = ()
        with self.lock:
            start = time.perf_counter()
            if isinstance(decoded, _Anchor):
                digest, changed = decoded.digest, self._write_anchor(decoded)
            else:
                try:
                    digest, changed = self._write_deltas(decoded, entry.state_hash)
                except IntegrityError as e:
                    raise BadFiles([f.path for f in step.files], e) from e
                headers = tuple(header for header, *_ in decoded.files)
            self._digest, self._version, self._run = digest, entry.version, entry.run
            pause = time.perf_counter() - start
            with self._advanced:
                self._advanced.notify_all()
        return Applied(entry, step.via, changed, headers, fetched.bytes, fetched.seconds, decode_s, pause)

    def _write_anchor(self, decoded: _Anchor) -> tuple[str, ...]:
        if self._state is None:
            assert decoded.full is not None  # decoded for an empty reader
            self._full = decoded.full
            self._state = pieces.piece_views(decoded.full, self._layout) if self._layout else decoded.full
        else:
            assert self._full is not None  # held with the state
            for name, tensor in decoded.fresh.items():
                self._state[name].copy_(tensor)
            pieces.write_back(self._full, self._state, self._layout)
        return tuple(sorted(self._full))

    def _write_deltas(self, decoded: _Deltas, state_hash: str) -> tuple[StateDigest, tuple[str, ...]]:
        """Write every rank's changes, all or nothing (earlier ranks rolled back if a later one fails).

        Raises:
            IntegrityError: a rank's result or the whole state does not hash as recorded (state restored).
        """
        assert self._full is not None and self._state is not None and self._digest is not None  # a held version
        digest = self._digest
        rollback = Rollback()
        changed: set[str] = set()
        try:
            for header, changes, sub, sub_digest in decoded.files:
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
