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

from delta import SigningKey, Trust, trainer_key
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


def read_message(
    storage: Storage,
    path: str,
    kind: type[Message],
    key: bytes | None,
    max_bytes: int,
    listed: int | None = None,
    trust: Trust | None = None,
) -> Message:
    """The message of `kind` at `path`, from one bounded read: refused unread when its `listed` size is over
    `max_bytes`, and never read past `max_bytes` (a file that grew since it was listed, or was never listed); signed
    with the key `trust` accepts, when given.

    Raises:
        FleetMessageError: over the bound (`Refusal.TOO_LARGE`) or not a valid message (`wire.fleet.decode`).
        FileNotFoundError, delta.StorageError: as `Storage.read`.
    """
    if listed is not None and listed > max_bytes:
        raise too_large(path, listed, max_bytes)
    try:
        data = storage.read(path, max_bytes=max_bytes)
    except FileTooLargeError as e:
        raise too_large(path, e.size, max_bytes) from e
    return decode(data, kind, path, key, max_bytes, trust)


class FleetBucket:
    """The fleet's files in one bucket. Every method blocks on the bucket; instances may be shared
    between threads (the storage is).

    Args:
        bucket: A bucket URL (as `delta.open_storage` takes) or an open `Storage`.
        secret: The run's shared secret (the rollout token), or None. With it every file written is signed,
            and every file read must carry a valid signature (`wire.fleet.decode`).
        signer: The trainer's key: the run's settings it writes are signed with it (None: `delta.trainer_key`, the key
            its `delta.Publisher` signs the bucket's versions with, taken at the first `write_run`).
        trust: Whose signature the run's settings must carry to be read (share the weights' subscriber's, so both trust
            one key); None: the signer's own key for a trainer, else `delta.Trust.for_bucket` (``DELTA_TRUSTED_KEY``,
            or the key trusted on first use).

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
    ) -> None:
        self.storage = open_storage(bucket) if isinstance(bucket, str) else bucket
        self.key = fleet_key(secret) if secret else None
        self.signer = signer
        self.trust = trust or Trust.for_bucket(self.storage.url, signer.public if signer is not None else None)
        self.runs_refused = 0
        self.run_refusal: str | None = None
        self._trusted_run: RunSettings | None = None  # the last run settings read that the trusted key signed
        self._run_too_large: tuple[int, FleetMessageError] | None = None  # (listed size, the refusal)

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
        self.storage.write(RUN_PATH, encode(run, self.key, self.signer))

    def read_run(self) -> RunSettings | None:
        """The run settings, or None while no trainer has written any (read no further than `MAX_RUN_BYTES`).
        Once refused as too large, the file is not read again until its listed size changes (a listing per call
        instead of a bounded read). Settings not signed by the trusted key are refused (counted in `runs_refused`,
        once per file, and logged) and the last trusted ones are returned instead, until the trainer writes new ones;
        with none yet, the refusal is raised."""
        if self._run_too_large is not None:
            size, error = self._run_too_large
            if self._listed_size(RUN_PATH) == size:
                raise error
            self._run_too_large = None
        try:
            run = read_message(self.storage, RUN_PATH, RunSettings, self.key, MAX_RUN_BYTES, trust=self.trust)
        except FileNotFoundError:
            return None
        except FleetMessageError as e:
            if e.category == Refusal.UNTRUSTED:
                self._refuse_run(e)
                if self._trusted_run is not None:
                    return self._trusted_run
            listed = self._listed_size(RUN_PATH) if e.category == Refusal.TOO_LARGE else None
            if listed is not None:
                self._run_too_large = (listed, e)
            raise
        self._trusted_run = run
        return run

    def _refuse_run(self, error: FleetMessageError) -> None:
        """Count and log run settings that the trusted key did not sign, once per refusal (they are read every poll)."""
        text = str(error)  # one line: the refusal's text is escaped (`delta.UntrustedVersionError`)
        if text != self.run_refusal:
            self.run_refusal = text
            self.runs_refused += 1
            logger.warning("REFUSED the run's settings: %s", text)

    def _listed_size(self, path: str) -> int | None:
        return next((f.size for f in self.storage.list(path) if f.path == path), None)

    # -- groups (the servers write, the trainer reads and deletes) -------------------------------------

    def write_group(self, group: GameGroup) -> str:
        """Commit one group; returns its path."""
        self.storage.write(group.path, encode(group, self.key))
        return group.path

    def list_groups(self) -> list[StoredFile]:
        """Every group file in the bucket, of any run, sorted by path."""
        return self.storage.list(GROUPS_PREFIX)

    def read_group(self, path: str, max_bytes: int = MAX_MESSAGE_BYTES, listed: int | None = None) -> GameGroup:
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
        return self.storage.list(SERVERS_PREFIX)

    def read_heartbeat(self, path: str, listed: int | None = None) -> Heartbeat:
        """The heartbeat at `path`, checked: also that it is the file of the server it names. Over
        `MAX_HEARTBEAT_BYTES` (by its `listed` size, or while reading): refused, not read past that."""
        beat = read_message(self.storage, path, Heartbeat, self.key, MAX_HEARTBEAT_BYTES, listed)
        if server_path(beat.server_id) != path:
            raise FleetMessageError(
                path,
                f"holds the heartbeat of server {beat.server_id}: written under another server's name",
                Refusal.RENAMED,
            )
        return beat
