"""Readers never go back: the newest version a reader of a bucket applied, per run, kept beside its trust.

Whoever can write to a bucket can commit an older manifest of the trainer's again under a new commit number: every
signature in it holds, and a reader following the newest manifest would go back to an older state and report lag 0.
So a reader keeps the newest version of each run it applied (`Seen.applied`) and refuses, before anything is fetched,
a newest manifest that ends before it, or that is of an earlier run than the last it followed (`Seen.check`), as TUF
keeps its last trusted metadata. Kept in an owner-only file beside the trust-on-first-use pin, so that a restarted
reader refuses them too; a new run of the trainer (a run never seen) is followed, as a restarted reader always did.

Each record names the key that signed what was applied, and binds only versions of that key: a thief of the trainer's
old key may have numbered its versions far ahead, and a reader that moved to the trainer's new key must not wait for
the trainer to reach them (TUF forgets its trusted timestamp and snapshot when their keys rotate, for the same
fast-forward). A record of an older `delta`, which names no key, binds every key.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import UntrustedVersionError
from ..private import read_private, write_private
from .manifest import VersionEntry

logger = logging.getLogger(__name__)

#: Runs kept, the last followed last (older ones are forgotten: a trainer starts few runs on one bucket).
MAX_RUNS = 16


class Seen:
    """The newest version applied of each run of one bucket, and the key that signed it (`path`: the file that keeps
    them; None: this process alone). Thread-safe: the readers of one bucket in a process share one, through their
    `Trust`."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._runs: dict[str | None, _Record] | None = None  # run -> newest applied; the last followed last
        self._lock = threading.Lock()
        self._unwritable = False  # said once

    def check(self, entry: VersionEntry, what: str) -> None:
        """Refuse `entry`, the newest version a manifest offers (its signature checked), if a reader went past it
        under the key that signed it.

        Raises:
            UntrustedVersionError: (reason "rollback") older than the newest applied of its run, or of an earlier run.
        """
        with self._lock:
            runs = {run: r.version for run, r in self._runs_now().items() if r.signer in (None, entry.signer)}
            last = next(reversed(runs), None) if runs else None
            if entry.run in runs and entry.run != last:
                raise UntrustedVersionError(
                    f"{what} ends at version {entry.version} of run {entry.run}, an earlier run than the one followed "
                    f"({last}): an old manifest committed again; kept what is held, waiting for the trainer's next",
                    version=entry.version,
                    reason="rollback",
                )
            newest = runs.get(entry.run)
            if newest is not None and entry.version < newest:
                raise UntrustedVersionError(
                    f"{what} ends at version {entry.version}, older than version {newest} already applied: an old "
                    "manifest committed again; kept what is held, waiting for the trainer's next",
                    version=entry.version,
                    reason="rollback",
                )

    def applied(self, entry: VersionEntry) -> None:
        """Keep `entry` (just applied) as its run's newest and the run followed, merged with what another reader of the
        bucket kept meanwhile (its runs count as earlier ones); a record of another key gives way to it."""
        with self._lock:
            runs = self._runs_now()
            now = _Record(entry.version, entry.signer)
            if list(runs)[-1:] == [entry.run] and runs[entry.run].binds(now):
                return
            try:
                other = self._read()
            except OSError:  # what this process applied still holds; the write below says what fails
                other = {}
            merged = {run: record for run, record in other.items() if run not in runs and run != entry.run}
            for run, record in runs.items():
                if run != entry.run:
                    merged[run] = max(record, other.get(run, record), key=lambda r: r.version)
            for kept in (runs.get(entry.run), other.get(entry.run)):
                if kept is not None and kept.binds(now):
                    now = _Record(kept.version, now.signer)
            merged[entry.run] = now
            while len(merged) > MAX_RUNS:
                merged.pop(next(iter(merged)))
            self._runs = merged
            if self.path is not None and entry.run is not None:
                body = [[run, r.version, r.signer] for run, r in merged.items() if run is not None]
                try:
                    write_private(self.path, json.dumps({"runs": body}).encode())
                except OSError as e:  # a cache that cannot be written: this process still never goes back
                    if not self._unwritable:
                        logger.warning("%s cannot be written (%s): a restarted reader may go back", self.path, e)
                    self._unwritable = True

    def _runs_now(self) -> dict[str | None, _Record]:
        """The runs kept (`_lock` held), read from the file at the first call."""
        if self._runs is None:
            self._runs = self._read()
        return self._runs

    def _read(self) -> dict[str | None, _Record]:
        """The runs the file keeps ({} for none, or one that holds something else: said, never a reason to stop)."""
        if self.path is None:
            return {}
        data = read_private(self.path)
        if data is None:
            return {}
        try:
            return {
                str(run): _Record(int(version), str(signer[0]) if signer and signer[0] is not None else None)
                for run, version, *signer in json.loads(data)["runs"]
            }
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("%s does not hold the versions a reader applied (%s): kept anew", self.path, e)
            return {}


@dataclass(frozen=True)
class _Record:
    """The newest version applied of a run, and the key that signed it (None: unknown, kept by an older `delta`)."""

    version: int
    signer: str | None

    def binds(self, other: _Record) -> bool:
        """Whether this record stands beside `other`, a version just applied: the same key's (or unknown), no older."""
        return self.signer in (None, other.signer) and self.version >= other.version
