"""The bucket events feed's state: what changed in each bucket, kept for replay, and the streams open on it.

What the client reads (huggingface_hub 2.4, `_bucket_live_follow.py`): `GET /api/buckets/<id>/events` with `Accept:
text/event-stream`, resumed by `cursor` (strictly after that batch) or `since` (an ISO 8601 instant); events `changes`
(`{cursor, changes: [{path, op: add|update|delete, size, xetHash, uploadedAt, mtime}]}`, an `update` carrying only
the fields that changed), `ready` (`{cursor?}`, after the replay; no cursor while the feed has seen no change),
`reset` (`{reason}`: the resume point is older than what is kept) and `reconnect` (`{cursor?}`: the server ends the
stream). Inferred here (docs/local-hub.md): a cursor is `<epoch>.<n>`, the n-th batch of the bucket since this server
process started or was reset (another epoch's cursor, or one past the last batch, answers `reset`; one that does
not parse, 400); `since` replays every kept batch made after it (to the millisecond: the client resumes from the
bucket's `updatedAt` after listing it, "so any change landing after that instant is replayed") and answers `reset`
only where a batch after it is no longer known (dropped from the buffer, or made before this process kept any); a
batch is kept
`Settings.events_replay_s` seconds; one batch call that changed something is one `changes` event, its changes in
the call's order; a call that changed nothing sends none.

The server runs one event loop: a stream is registered and its replay taken in one step, so every batch reaches it
exactly once, from the replay or from its queue.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .listing import iso
from .store import Bucket, BucketFile

PING = b": ping\n\n"


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (the feed always sends a `data:` line; the client dispatches nothing without one)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def file_change(path: str, before: BucketFile | None, after: BucketFile | None) -> dict[str, Any] | None:
    """The change a batch operation made to `path`, as the feed reports it, or None where nothing changed."""
    if after is None:
        return None if before is None else {"path": path, "op": "delete"}
    fields = {
        "size": after.size,
        "xetHash": after.xet_hash,
        "uploadedAt": iso(after.uploaded_at),
        "mtime": iso(after.mtime_ms / 1000),
    }
    if before is None:
        return {"path": path, "op": "add", **fields}
    earlier = {"size": before.size, "xetHash": before.xet_hash, "uploadedAt": iso(before.uploaded_at),
               "mtime": iso(before.mtime_ms / 1000)}
    changed = {k: v for k, v in fields.items() if earlier[k] != v}
    return {"path": path, "op": "update", **changed} if changed else None


@dataclass(frozen=True)
class Batch:
    """The changes of one batch call: the `n`-th of its bucket, made at unix time `at`."""

    n: int
    at: float
    changes: list[dict[str, Any]]


Resume = tuple[Literal["cursor", "since"], int] | tuple[Literal["live"], None]
"""Where a stream starts: after the n-th batch, after an instant (unix milliseconds), or with what comes next."""


class ResumeError(ValueError):
    """A `cursor` or `since` that does not parse (the route answers 400)."""


def parse_resume(cursor: str | None, since: str | None, epoch: str) -> Resume | None:
    """The resume point a request asks for; None for a cursor of another epoch (its batches are not known here).
    A cursor wins over `since`.

    Raises:
        ResumeError: The cursor or the instant does not parse.
    """
    if cursor is not None:
        cursor_epoch, _, n = cursor.partition(".")
        if not cursor_epoch or not n.isdigit():
            raise ResumeError(f"invalid cursor {cursor!r}")
        return ("cursor", int(n)) if cursor_epoch == epoch else None
    if since:
        try:
            return ("since", round(datetime.fromisoformat(since).timestamp() * 1000))
        except ValueError as error:
            raise ResumeError(f"invalid since {since!r}: an ISO 8601 instant, e.g. 2026-01-01T00:00:00.000Z") from error
    return ("live", None)


@dataclass
class EventLog:
    """One bucket's batches in this epoch: the last `kept` (by time), and what came before them.

    Attributes:
        last: The number of the bucket's last batch (0: none yet in this epoch).
        dropped: The number of the last batch dropped from the buffer (0: none).
        unknown_until: Unix time up to which changes may have happened that the log does not hold: the bucket's last
            change before the log was made, then the time of the last batch dropped.
    """

    unknown_until: float
    last: int = 0
    dropped: int = 0
    kept: deque[Batch] = field(default_factory=deque)

    def append(self, changes: list[dict[str, Any]], at: float) -> Batch:
        self.last += 1
        batch = Batch(self.last, at, changes)
        self.kept.append(batch)
        return batch

    def prune(self, now: float, keep_s: float) -> None:
        """Drop the batches older than `keep_s` seconds."""
        while self.kept and self.kept[0].at < now - keep_s:
            gone = self.kept.popleft()
            self.dropped, self.unknown_until = gone.n, max(self.unknown_until, gone.at)

    def replay(self, resume: Resume) -> list[Batch] | None:
        """The kept batches after `resume`, oldest first; None when a batch after it is no longer known (`reset`)."""
        match resume:
            case ("cursor", n):
                if n < self.dropped or n > self.last:
                    return None
                return [b for b in self.kept if b.n > n]
            case ("since", ms):
                if _ms(self.unknown_until) > ms:
                    return None
                return [b for b in self.kept if _ms(b.at) > ms]
        return []


def _ms(at: float) -> int:
    """The instant to the millisecond as the feed's ISO 8601 times write it (truncated, as `listing.iso`)."""
    return int(at * 1000)


class Stream:
    """An open stream's inbox: batches as they are made, and what else it must act on (`POKE`: the fault rules
    changed; `END`: its bucket is gone or the Hub was reset; `GONE`: the client left).

    Attributes:
        position: The number of the last batch it has been given (its cursor).
    """

    POKE, END, GONE = "poke", "end", "gone"

    def __init__(self, position: int) -> None:
        self.position = position
        self.inbox: asyncio.Queue[Batch | str] = asyncio.Queue()


class Feeds:
    """Every bucket's `EventLog` and the streams open on it, for one epoch (a process, or until a reset).

    Attributes:
        epoch: Names this epoch in the cursors.
    """

    def __init__(self) -> None:
        self.epoch = secrets.token_hex(4)
        self._logs: dict[str, EventLog] = {}
        self._streams: dict[str, set[Stream]] = {}

    def cursor(self, n: int) -> str | None:
        """The cursor after batch `n` (None for 0: no batch yet)."""
        return f"{self.epoch}.{n}" if n else None

    def publish(self, bucket: Bucket, changes: list[dict[str, Any]], now: float, keep_s: float) -> None:
        """Record one batch call's changes (and `bucket.updated_at`), and hand them to the bucket's open streams."""
        log = self._log(bucket)
        bucket.updated_at = now
        batch = log.append(changes, now)
        log.prune(now, keep_s)
        for stream in self._streams.get(bucket.id, ()):
            stream.inbox.put_nowait(batch)

    def open(
        self, bucket: Bucket, resume: Resume | None, now: float, keep_s: float
    ) -> tuple[Stream, list[Batch]] | None:
        """A stream on `bucket` from `resume` and the batches to replay first; None where it must be told `reset`."""
        log = self._log(bucket)
        log.prune(now, keep_s)
        replay = None if resume is None else log.replay(resume)
        if replay is None:
            return None
        stream = Stream(log.last)
        self._streams.setdefault(bucket.id, set()).add(stream)
        return stream, replay

    def close(self, bucket_id: str, stream: Stream) -> None:
        self._streams.get(bucket_id, set()).discard(stream)

    def poke(self) -> None:
        """Tell every open stream that the fault rules changed."""
        for streams in self._streams.values():
            for stream in streams:
                stream.inbox.put_nowait(Stream.POKE)

    def end(self, bucket_id: str) -> None:
        """The bucket is gone (deleted or moved): its streams end and its log is forgotten."""
        for stream in self._streams.pop(bucket_id, set()):
            stream.inbox.put_nowait(Stream.END)
        self._logs.pop(bucket_id, None)

    def reset(self) -> None:
        """A new epoch: every stream ends, every log is forgotten, earlier cursors are answered `reset`."""
        for bucket_id in list(self._streams):
            self.end(bucket_id)
        self._logs.clear()
        self.epoch = secrets.token_hex(4)

    def _log(self, bucket: Bucket) -> EventLog:
        log = self._logs.get(bucket.id)
        if log is None:
            log = self._logs[bucket.id] = EventLog(unknown_until=bucket.updated_at)
        return log
