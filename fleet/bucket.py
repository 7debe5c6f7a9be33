"""The fleet's files in the bucket, beside the weights: `wire.fleet`'s messages through a role's `delta.Bucket`.

A reader sees a message whole or not at all (each write is atomic); `decode` still checks each one, since a
bucket is shared and files can be crafted.

| file | written by | deleted by |
|---|---|---|
| ``fleet/run.json`` | the trainer, at each change of state, signed with its key | nobody (replaced) |
| ``fleet/groups/*.json`` | a rollout server, once per group | the trainer: taken, too stale, or refused |
| ``fleet/servers/*.json`` | each rollout server, every few seconds | the trainer, once silent for an hour |"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import delta
from delta.signing import Handover
from delta.storage import FileTooLargeError, StoredFile
from wire.fleet import (
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
    bucket: delta.Bucket,
    path: str,
    kind: type[Message],
    key: bytes | None,
    max_bytes: int,
    listed: StoredFile | None = None,
    trust: delta.Trust | None = None,
) -> Message:
    """The message of `kind` at `path`, from one read bounded by `max_bytes` (refused unread when `listed` larger),
    signed with a key `trust` accepts, when given.

    Raises:
        FleetMessageError: over the bound (`Refusal.TOO_LARGE`) or not a valid message (`wire.fleet.decode`).
        FileNotFoundError, delta.StorageError: as `Bucket.read`.
    """
    if listed is not None and listed.size > max_bytes:
        raise too_large(path, listed.size, max_bytes)
    try:
        data = bucket.read(path, max_bytes=max_bytes, listed=listed)
    except FileTooLargeError as e:
        raise too_large(path, e.size, max_bytes) from e
    return decode(data, kind, path, key, max_bytes, trust)


class FleetBucket:
    """The fleet's files in one bucket; instances may be shared between threads. What is polled comes from the bucket's
    shared listing (at most `listing_age_s` old), and a file listed unchanged is not read again (`Bucket.parsed`).

    Args:
        bucket: The role's `delta.Bucket` (a trainer's signs the run's settings), or a URL (opened with `options`).
        secret: The run's shared secret (the rollout token): every file written is signed with it and every file
            read must be. None: unsigned.
        handovers: The key handovers that lead to the trainer's key, written beside the run's settings.

    Attributes:
        runs_refused, run_refusal: Run settings refused for their signature (each file once), and why the last.

    Raises (every method): as `delta.Bucket`, and `wire.fleet.FleetMessageError` for a file that is not a valid
    message.
    """

    def __init__(
        self,
        bucket: delta.Bucket | str,
        secret: str | None = None,
        *,
        handovers: Sequence[Handover] = (),
        **options: Any,
    ) -> None:
        self.bucket = delta.Bucket.of(bucket, **options)
        self.handovers = tuple(handovers)
        self.key = fleet_key(secret) if secret else None
        self.runs_refused = 0
        self.run_refusal: str | None = None
        self._trusted_run: RunSettings | None = None  # the last run settings read that the trusted key signed

    @property
    def trust(self) -> delta.Trust:
        """Whose signature the run's settings must carry: the bucket's (one for the weights and the settings)."""
        return self.bucket.trust

    @property
    def budget(self) -> delta.Budget:
        """How often the fleet's files are read and written (the bucket's kind's)."""
        return self.bucket.budget

    @property
    def max_age(self) -> float:
        """How old a listing the reads may answer from (the bucket's budget)."""
        return self.bucket.budget.listing_age_s

    @property
    def signed(self) -> bool:
        """Whether this bucket's files are signed (a secret was given)."""
        return self.key is not None

    @property
    def url(self) -> str:
        return self.bucket.url

    # -- the run (the trainer writes, the servers read) -----------------------------------------------

    def write_run(self, run: RunSettings) -> None:
        """Write the run's settings, signed with the trainer's key (the bucket's: a writer's)."""
        self.bucket.write(RUN_PATH, encode(run, self.key, self.bucket.signing_key, self.handovers))

    def read_run(self) -> RunSettings | None:
        """The run settings, or None while no trainer has written any; read again only once listed with other content.
        Settings the trusted key did not sign are refused (counted once, logged) and the last trusted ones returned
        instead; with none yet, the refusal is raised."""
        listed = next((f for f in self.bucket.list(RUN_PATH, max_age=self.max_age) if f.path == RUN_PATH), None)
        if listed is None:
            return None
        trust = self.bucket.trust
        try:
            run = self.bucket.parsed(
                listed,
                lambda: read_message(self.bucket, RUN_PATH, RunSettings, self.key, MAX_RUN_BYTES, listed, trust),
                (FleetMessageError,),
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
        self.bucket.write_many({g.path: encode(g, self.key) for g in groups})
        return [g.path for g in groups]

    def list_groups(self, max_age: float | None = None) -> list[StoredFile]:
        """Every group file in the bucket, of any run, sorted by path (from a listing at most `max_age` old; None:
        the bucket's `max_age`)."""
        return self.bucket.list(GROUPS_PREFIX, max_age=self.max_age if max_age is None else max_age)

    def read_group(self, path: str, max_bytes: int = MAX_MESSAGE_BYTES, listed: StoredFile | None = None) -> GameGroup:
        """The group at `path`, checked (over `max_bytes`, by its `listed` size or while reading: refused, not read
        past that); FileNotFoundError when it was deleted meanwhile."""
        group = read_message(self.bucket, path, GameGroup, self.key, max_bytes, listed)
        if group.path != path:
            raise FleetMessageError(
                path, f"holds the group of {group.path}: a file renamed or copied by hand", Refusal.RENAMED
            )
        return group

    def delete(self, paths: list[str]) -> None:
        self.bucket.delete(paths)

    # -- heartbeats (each server writes its own, the trainer reads them all) ---------------------------

    def write_heartbeat(self, beat: Heartbeat) -> None:
        self.bucket.write(server_path(beat.server_id), encode(beat, self.key))

    def list_heartbeats(self) -> list[StoredFile]:
        """Every heartbeat file, sorted by path (from a listing at most `max_age` old)."""
        return self.bucket.list(SERVERS_PREFIX, max_age=self.max_age)

    def read_heartbeat(self, path: str, listed: StoredFile | None = None) -> Heartbeat:
        """The heartbeat at `path`, checked to be the file of the server it names, bounded by `MAX_HEARTBEAT_BYTES`; one
        `listed` unchanged since it was read is not read again."""

        def read() -> Heartbeat:
            beat = read_message(self.bucket, path, Heartbeat, self.key, MAX_HEARTBEAT_BYTES, listed)
            if server_path(beat.server_id) != path:
                raise FleetMessageError(
                    path,
                    f"holds the heartbeat of server {beat.server_id}: written under another server's name",
                    Refusal.RENAMED,
                )
            return beat

        beat = self.bucket.parsed(listed, read, (FleetMessageError,)) if listed is not None else read()
        assert isinstance(beat, Heartbeat)
        return beat
