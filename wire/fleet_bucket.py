"""The fleet's area of the bucket, beside the weights: read and write the messages of `wire.fleet`.

Atomicity is the storage backend's: a local folder writes a temporary file and renames it, S3 and
Hugging Face buckets replace an object whole on upload. So a reader sees a message whole or not at
all; `decode` still checks each one (its hash, its signature when the run signs, every field), since a
bucket is shared and files can be damaged or crafted. Who writes and who deletes:

| file | written by | deleted by |
|---|---|---|
| ``fleet/run.json`` | the trainer, at each change of state, signed with its key | nobody (replaced) |
| ``fleet/groups/*.json`` | a rollout server, once per group | the trainer: taken, too stale, or refused |
| ``fleet/servers/*.json`` | each rollout server, every few seconds | the trainer, once silent for an hour |
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from delta import Handover, SigningKey, Trust, trainer_key
from delta.storage import FileTooLargeError, Storage, StoredFile, open_storage

from .fleet import (
    GROUPS_PREFIX,
    MAX_HEARTBEAT_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_RUN_BYTES,
    RUN_PATH,
    SERVERS_PREFIX,
    FleetMessageError,
    GameGroup,
    Heartbeat,
    Message,
    Refusal,
    RunSettings,
    decode,
    encode,
    fleet_key,
    server_path,
    too_large,
)

logger = logging.getLogger(__name__)

#: Files whose last reading is kept (heartbeats and the run's settings: a few per server).
_MAX_KNOWN = 1024


def read_message(
    storage: Storage,
    path: str,
    kind: type[Message],
    key: bytes | None,
    max_bytes: int,
    listed: StoredFile | None = None,
    trust: Trust | None = None,
) -> Message:
    """The message of `kind` at `path`, from one bounded read: refused unread when its `listed` size is over
    `max_bytes`, and never read past `max_bytes` (a file that grew since it was listed, or was never listed); signed
    with the key `trust` accepts, when given. `listed`: its entry in a listing, read as listed (`Storage.read`: no
    metadata asked again).

    Raises:
        FleetMessageError: over the bound (`Refusal.TOO_LARGE`) or not a valid message (`wire.fleet.decode`).
        FileNotFoundError, delta.StorageError: as `Storage.read`.
    """
    if listed is not None and listed.size > max_bytes:
        raise too_large(path, listed.size, max_bytes)
    try:
        data = storage.read(path, max_bytes=max_bytes, listed=listed)
    except FileTooLargeError as e:
        raise too_large(path, e.size, max_bytes) from e
    return decode(data, kind, path, key, max_bytes, trust)


class FleetBucket:
    """The fleet's files in one bucket. Every method blocks on the bucket; instances may be shared
    between threads (the storage is).

    Requests: what this process's readers poll (the run's settings, groups, heartbeats) is listed from one listing of
    the bucket shared by every poller of the process (`Storage.list`'s `max_age`), and a file listed with the content
    it had when it was read last (the same size and etag: the run's settings, a heartbeat that did not beat) is not
    read again. A write is one request; a read of a file listed asks nothing more of the bucket than its content.

    Args:
        bucket: A bucket URL (as `delta.open_storage` takes) or an open `Storage`.
        secret: The run's shared secret (the rollout token), or None. With it every file written is signed,
            and every file read must carry a valid signature (`wire.fleet.decode`).
        signer: The trainer's key: the run's settings it writes are signed with it (None: `delta.trainer_key`, the key
            its `delta.Publisher` signs the bucket's versions with, taken at the first `write_run`).
        trust: Whose signature the run's settings must carry to be read (share the weights' subscriber's, so both trust
            one key); None: the signer's own key for a trainer, else `delta.Trust.for_bucket` (``DELTA_TRUSTED_KEY``,
            or the key trusted on first use).
        max_age: Seconds a listing of the bucket this process made may be old to answer the reads (the pollers'
            interval); 0: listed at every read.
        handovers: The key handovers that lead to `signer` (a trainer whose key replaced another), written beside the
            run's settings' signature (`wire.fleet.encode`).

    Attributes:
        runs_refused: Run settings refused so far for their signature (each file counted once); the last ones
            trusted are read instead (`read_run`).
        run_refusal: Why the last were refused, or None.

    Raises (every method): as `delta.storage.Storage` (FileNotFoundError is handled where a file may be
    missing), and `wire.fleet.FleetMessageError` for a file that is not a valid message.
    """

    def __init__(
        self,
        bucket: str | Storage,
        secret: str | None = None,
        *,
        signer: SigningKey | None = None,
        trust: Trust | None = None,
        max_age: float = 0.0,
        handovers: Sequence[Handover] = (),
    ) -> None:
        self.storage = open_storage(bucket) if isinstance(bucket, str) else bucket
        self.handovers = tuple(handovers)
        self.key = fleet_key(secret) if secret else None
        self.signer = signer
        self.trust = trust or Trust.for_bucket(self.storage.url, signer.public if signer is not None else None)
        self.runs_refused = 0
        self.run_refusal: str | None = None
        self._trusted_run: RunSettings | None = None  # the last run settings read that the trusted key signed
        self.max_age = max_age
        # path -> as listed when read, and what was read (the run's settings, heartbeats) or why it was refused
        self._known: dict[str, tuple[StoredFile, RunSettings | Heartbeat | FleetMessageError]] = {}

    @property
    def signed(self) -> bool:
        """Whether this bucket's files are signed (a secret was given)."""
        return self.key is not None

    @property
    def url(self) -> str:
        return self.storage.url

    # -- the run (the trainer writes, the servers read) -----------------------------------------------

    def write_run(self, run: RunSettings) -> None:
        """Write the run's settings, signed with `signer` (the trainer's key)."""
        if self.signer is None:
            self.signer = trainer_key(self.storage.url)
        self.storage.write(RUN_PATH, encode(run, self.key, self.signer, self.handovers))

    def read_run(self) -> RunSettings | None:
        """The run settings, or None while no trainer has written any (read no further than `MAX_RUN_BYTES`; refused
        unread when listed larger). Read again only once the listing shows other content. Settings not signed by the
        trusted key are refused (counted in `runs_refused`, once per file, and logged) and the last trusted ones are
        returned instead, until the trainer writes new ones; with none yet, the refusal is raised."""
        listed = next((f for f in self.storage.list(RUN_PATH, max_age=self.max_age) if f.path == RUN_PATH), None)
        if listed is None:
            return None
        try:
            run = self._read(
                RUN_PATH,
                listed,
                lambda: read_message(self.storage, RUN_PATH, RunSettings, self.key, MAX_RUN_BYTES, listed, self.trust),
            )
        except FileNotFoundError:
            return None
        except FleetMessageError as e:
            if e.category == Refusal.UNTRUSTED:
                self._refuse_run(e)
                if self._trusted_run is not None:
                    return self._trusted_run
            raise
        assert isinstance(run, RunSettings)
        self._trusted_run = run
        return run

    def _read(
        self, path: str, listed: StoredFile, read: Callable[[], RunSettings | Heartbeat]
    ) -> RunSettings | Heartbeat:
        """`read()`, or what it gave (or raised) last time if `path` is listed with the same content (the same size
        and etag) as then."""
        known = self._known.get(path)
        if known is None or listed.etag is None or known[0] != listed:
            result: RunSettings | Heartbeat | FleetMessageError
            try:
                result = read()
            except FleetMessageError as e:
                result = e
            if len(self._known) >= _MAX_KNOWN:
                self._known.pop(next(iter(self._known)))
            known = self._known[path] = (listed, result)
        if isinstance(known[1], FleetMessageError):
            raise known[1]
        return known[1]

    def _refuse_run(self, error: FleetMessageError) -> None:
        """Count and log run settings that the trusted key did not sign, once per refusal (they are read every poll)."""
        text = str(error)  # one line: the refusal's text is escaped (`delta.UntrustedVersionError`)
        if text != self.run_refusal:
            self.run_refusal = text
            self.runs_refused += 1
            logger.warning("REFUSED the run's settings: %s", text)

    # -- groups (the servers write, the trainer reads and deletes) -------------------------------------

    def write_group(self, group: GameGroup) -> str:
        """Commit one group; returns its path."""
        return self.write_groups([group])[0]

    def write_groups(self, groups: list[GameGroup]) -> list[str]:
        """Commit a batch's groups in one write (one request on the Hub, not one per group); returns their paths.
        Not atomic: on an error, some may be committed (each group stands alone: a reader takes what it finds)."""
        self.storage.write_many({g.path: encode(g, self.key) for g in groups})
        return [g.path for g in groups]

    def list_groups(self, max_age: float | None = None) -> list[StoredFile]:
        """Every group file in the bucket, of any run, sorted by path (from a listing at most `max_age` old; None:
        the bucket's `max_age`)."""
        return self.storage.list(GROUPS_PREFIX, max_age=self.max_age if max_age is None else max_age)

    def read_group(self, path: str, max_bytes: int = MAX_MESSAGE_BYTES, listed: StoredFile | None = None) -> GameGroup:
        """The group at `path`, checked (over `max_bytes`, by its `listed` size or while reading: refused, not read
        past that); FileNotFoundError when it was deleted meanwhile."""
        group = read_message(self.storage, path, GameGroup, self.key, max_bytes, listed)
        if group.path != path:
            raise FleetMessageError(
                path, f"holds the group of {group.path}: a file renamed or copied by hand", Refusal.RENAMED
            )
        return group

    def delete(self, paths: list[str]) -> None:
        self.storage.delete(paths)

    # -- heartbeats (each server writes its own, the trainer reads them all) ---------------------------

    def write_heartbeat(self, beat: Heartbeat) -> None:
        self.storage.write(server_path(beat.server_id), encode(beat, self.key))

    def list_heartbeats(self) -> list[StoredFile]:
        """Every heartbeat file, sorted by path (from a listing at most `max_age` old)."""
        return self.storage.list(SERVERS_PREFIX, max_age=self.max_age)

    def read_heartbeat(self, path: str, listed: StoredFile | None = None) -> Heartbeat:
        """The heartbeat at `path`, checked: also that it is the file of the server it names. Over
        `MAX_HEARTBEAT_BYTES` (by its `listed` size, or while reading): refused, not read past that. A heartbeat
        `listed` with the content it had when it was read last is not read again."""

        def read() -> Heartbeat:
            beat = read_message(self.storage, path, Heartbeat, self.key, MAX_HEARTBEAT_BYTES, listed)
            if server_path(beat.server_id) != path:
                raise FleetMessageError(
                    path,
                    f"holds the heartbeat of server {beat.server_id}: written under another server's name",
                    Refusal.RENAMED,
                )
            return beat

        beat = self._read(path, listed, read) if listed is not None else read()
        assert isinstance(beat, Heartbeat)
        return beat
