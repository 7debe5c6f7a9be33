"""The messages the trainer and the rollout servers exchange through the bucket, and their file form.

Three kinds of file, each JSON, each committed whole by one `Storage.write` (see `fleet_bucket`):

- `RunSettings` (``fleet/run.json``), written by the trainer: which run is on, whether it runs, and the
  sampling and group settings every rollout server plays with.
- `GameGroup` (``fleet/groups/<run>.<server>.<boot>.<seq>.json``), written by a rollout server: one group
  of `num_generations` whole games played on one seed, with the weight version of every reply and the
  per-token logprobs of the sampler. The trainer deletes a group once it took it (or refused it).
- `Heartbeat` (``fleet/servers/<server>.json``), written by each rollout server every few seconds.

The exam records (`wire.exam`, ``exams/``, read and written by `wire.exam_shelf`) travel in the same envelope.
On disk a message is an envelope ``{"kind": ..., "sha256": ..., "body": {...}}``: `sha256` is the hash
of the body's canonical JSON (sorted keys, no spaces), so a file damaged in storage or crafted by hand
is refused by `decode` before anything reads its body. Pydantic only: light to import.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .curriculum import ExampleSchedule
from .exam import ExamRecord, ExamSettings
from .trajectory import Trajectory

#: Largest message file read: a group of 64 six-turn games of 1,024-token replies is ~10 MB of JSON.
MAX_MESSAGE_BYTES = 64 << 20
#: What a server id and a run id may hold: they become parts of bucket paths.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"

RUN_PATH = "fleet/run.json"
GROUPS_PREFIX = "fleet/groups/"
SERVERS_PREFIX = "fleet/servers/"


class FleetMessageError(ValueError):
    """A fleet file that is not a whole, valid message of the kind expected (torn, corrupt, crafted)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class RunState(str, Enum):
    """Whether the rollout servers should produce games for the run."""

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


class Sampling(BaseModel):
    """How the rollout servers play the run's games (the trainer's settings, `rollout_space.games.PlayParams`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(ge=1, le=4096, description="Most tokens per reply")
    temperature: float = Field(gt=0, le=10, description="Sampling temperature (> 0: a group needs different games)")
    max_turns: int = Field(ge=1, le=6, description="Replies per game before it is cut")
    reply_prefix: str = Field(max_length=64, description="Text that opens each reply, written for the policy")
    examples: ExampleSchedule = Field(ExampleSchedule(), description="How likely a game's messages show the env's "
                                                                     "example guess, by the version playing it")


class RunSettings(BaseModel):
    """``fleet/run.json``: the run the trainer is on. Written by the trainer at every change of state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(pattern=ID_PATTERN, description="New at every start of a trainer process")
    state: RunState
    num_generations: int = Field(ge=2, le=64, description="Games per group, all on one seed (GRPO's group)")
    groups_per_step: int = Field(ge=1, le=256, description="Groups one optimizer step trains on")
    max_staleness: int = Field(ge=0, description="Most versions a game's oldest reply may lag the trainer")
    max_pending_groups: int = Field(ge=1, description="Back-pressure: servers stop producing while this many "
                                                      "groups of the run wait in the bucket")
    sampling: Sampling
    exam: ExamSettings | None = Field(None, description="How the servers examine the policy (None: no exams)")
    trainer_version: int = Field(ge=0, description="The trainer's weight version when this was written")
    updated_at: float = Field(description="Unix time on the trainer's clock (informational)")


class GameGroup(BaseModel):
    """One group of games: `num_generations` games on one seed, played by one rollout server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(pattern=ID_PATTERN)
    server_id: str = Field(pattern=ID_PATTERN)
    boot: str = Field(pattern=ID_PATTERN, description="The server process's start id (a restart gets a new one)")
    seq: int = Field(ge=0, description="The group's number within the server process")
    seed: int = Field(description="The env seed every game of the group was played on")
    games: list[Trajectory] = Field(min_length=1, max_length=64)
    played_s: float = Field(ge=0, description="Seconds the batch holding this group took to play")
    created_at: float = Field(description="Unix time on the server's clock (informational)")

    @model_validator(mode="after")
    def _games_are_whole(self) -> GameGroup:
        for i, game in enumerate(self.games):
            n = len(game.completion_ids)
            if len(game.logprobs) != n or len(game.env_mask) != n:
                raise ValueError(f"game {i}: {n} completion tokens but {len(game.logprobs)} logprobs and "
                                 f"{len(game.env_mask)} mask entries")
            if not game.versions or min(game.versions) < 0:
                raise ValueError(f"game {i}: no weight version recorded for its replies")
            if any(m not in (0, 1) for m in game.env_mask):
                raise ValueError(f"game {i}: env_mask holds values other than 0 and 1")
        return self

    @property
    def version(self) -> int:
        """The oldest weight version that played any reply of the group: staleness is judged on it."""
        return min(g.version for g in self.games)

    @property
    def path(self) -> str:
        """Where the group lives in the bucket."""
        return group_path(self.run_id, self.server_id, self.boot, self.seq)


class ServerState(str, Enum):
    """What a rollout server is doing, as its heartbeat says."""

    PRODUCING = "producing"
    FULL = "full"
    """Enough groups wait in the bucket for the staleness bound: back-pressure."""
    PAUSED = "paused"
    """The run is paused or stopped."""
    NO_RUN = "no run"
    """No trainer has written a run yet."""
    ERROR = "error"
    """The last attempt failed (the env, the bucket); retrying."""

    def __str__(self) -> str:
        return self.value


class Heartbeat(BaseModel):
    """``fleet/servers/<server_id>.json``: a rollout server's state, rewritten every few seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server_id: str = Field(pattern=ID_PATTERN)
    boot: str = Field(pattern=ID_PATTERN)
    beat: int = Field(ge=0, description="Counts up with every heartbeat: a reader sees the server alive while it "
                                        "changes, on the reader's own clock")
    run_id: str | None = Field(None, description="The run it produces for")
    state: ServerState
    version: int = Field(ge=0, description="The weight version it serves")
    games_per_min: float = Field(ge=0, description="Games written per minute, over the last minutes")
    groups_written: int = Field(ge=0, description="Groups written since it started")
    idle_share: float = Field(ge=0, le=1, description="Share of its time since start with nothing to play")
    last_error: str | None = Field(None, max_length=2000)
    updated_at: float = Field(description="Unix time on the server's clock (informational)")


Message = TypeVar("Message", RunSettings, GameGroup, Heartbeat, ExamRecord)
_KINDS: dict[type[BaseModel], str] = {RunSettings: "fleet-run/1", GameGroup: "fleet-group/1",
                                      Heartbeat: "fleet-heartbeat/1", ExamRecord: "exam/1"}


def group_path(run_id: str, server_id: str, boot: str, seq: int) -> str:
    """The bucket path of a group: run first, so a listing shows which run each group belongs to."""
    return f"{GROUPS_PREFIX}{run_id}.{server_id}.{boot}.{seq:08d}.json"


def group_run(path: str) -> str | None:
    """The run id a group's file name claims (None: not a group file name)."""
    match = re.fullmatch(re.escape(GROUPS_PREFIX) + r"([A-Za-z0-9][A-Za-z0-9_-]*)\.[^/]+\.json", path)
    return match.group(1) if match else None


def server_path(server_id: str) -> str:
    """The bucket path of a server's heartbeat."""
    return f"{SERVERS_PREFIX}{server_id}.json"


def _canonical(body: object) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def encode(message: BaseModel) -> bytes:
    """The file form of `message`: the envelope with its kind and the hash of its body."""
    body = message.model_dump(mode="json")
    raw = _canonical(body)
    return _canonical({"kind": _KINDS[type(message)], "sha256": hashlib.sha256(raw).hexdigest(), "body": body})


def decode(data: bytes, kind: type[Message], path: str = "<message>") -> Message:
    """The message in `data`, checked: size, JSON, kind, hash of the body, then every field.

    Raises:
        FleetMessageError: any check failed; the message names the file and what was wrong.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise FleetMessageError(path, f"{len(data)} bytes, more than the {MAX_MESSAGE_BYTES} a message may hold")
    try:
        envelope = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FleetMessageError(path, f"not whole JSON (torn or corrupt): {e}") from None
    if not isinstance(envelope, dict) or set(envelope) != {"kind", "sha256", "body"}:
        raise FleetMessageError(path, "not a fleet message: expected an object with kind, sha256 and body")
    expected: Literal["fleet-run/1", "fleet-group/1", "fleet-heartbeat/1", "exam/1"] = _KINDS[kind]  # type: ignore[assignment]
    if envelope["kind"] != expected:
        raise FleetMessageError(path, f"kind {str(envelope['kind'])[:40]!r}, expected {expected!r}")
    try:
        digest = hashlib.sha256(_canonical(envelope["body"])).hexdigest()
    except (TypeError, ValueError, RecursionError) as e:
        raise FleetMessageError(path, f"body cannot be hashed: {e}") from None
    if digest != envelope["sha256"]:
        raise FleetMessageError(path, "the body does not match its sha256 (corrupt or edited)")
    try:
        return kind.model_validate(envelope["body"])
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise FleetMessageError(path, f"invalid {where}: {first['msg']}") from None
