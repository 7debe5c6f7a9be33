"""The messages the trainer and the rollout servers exchange through the bucket, and their file form.

- `RunSettings` (``fleet/run.json``), written by the trainer: which run is on, whether it runs, and the sampling and
  group settings every rollout server plays with.
- `GameGroup` (``fleet/groups/<run>.<server>.<boot>.<seq>.json``), written by a rollout server: one group of whole
  games on one seed, with the weight version of every reply and the sampler's per-token logprobs.
- `Heartbeat` (``fleet/servers/<server>.json``), written by each rollout server every few seconds.

On disk a message is an envelope ``{"kind", "sha256", "body"}``; with the run's shared secret it also carries an
``"hmac"`` (`fleet_key`), and the run's settings carry the trainer's Ed25519 signature (``"signer"``,
``"signature"``, ``"handovers"``), read only when the reader's `delta.Trust` accepts it. The body is read strictly;
a kind's unknown version is refused in one line. Pydantic only: light to import."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .curriculum import ExampleSchedule
from .exam import ExamRecord, ExamSettings
from .lora import LoraSettings
from .trajectory import MAX_VERSION, Trajectory

if TYPE_CHECKING:  # `delta` loads torch: imported where a key is used, so that reading a message stays light
    from delta import SigningKey, Trust
    from delta.signing import Handover

#: Largest message file read at all (a group is held to a tighter bound from its run's settings:
#: `fleet_checks.max_group_bytes`): a group of 64 six-turn games of 1,024-token replies is ~10 MB of JSON.
MAX_MESSAGE_BYTES = 64 << 20
#: Largest run settings file read (``fleet/run.json`` is about 1 kB): read no further, whatever the file holds.
MAX_RUN_BYTES = 1 << 20
#: Largest heartbeat read (about 700 bytes; a 2,000-character last error at most).
MAX_HEARTBEAT_BYTES = 64 << 10
#: Largest integer a counter or id field holds (JSON numbers beyond 2**53 lose precision elsewhere).
MAX_COUNT = 2**53
#: What a server id and a run id may hold: they become parts of bucket paths.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
#: A key's fingerprint as `delta.PublicKey.fingerprint` writes it.
FINGERPRINT_PATTERN = r"^SHA256:[A-Za-z0-9+/]{43}$"
#: Most key handovers an envelope carries (a trainer's chain of keys on one bucket).
MAX_HANDOVERS = 16

RUN_PATH = "fleet/run.json"
GROUPS_PREFIX = "fleet/groups/"
SERVERS_PREFIX = "fleet/servers/"


class Refusal(StrEnum):  # str() and f-strings give the value
    """Why a fleet file was refused: what the trainer counts refusals by (`/status`, its page)."""

    ANOTHER_RUN = "another run"
    DAMAGED = "torn or corrupt"
    UNSIGNED = "unsigned or forged"
    UNTRUSTED = "not the trainer's key"
    TOO_LARGE = "too large"
    INVALID = "invalid fields"
    VOCABULARY = "token id out of the vocabulary"
    SHAPE = "not the run's shape"
    AHEAD = "version ahead of the trainer"
    RENAMED = "renamed or copied"
    UNEXPECTED = "unexpected error"


class FleetMessageError(ValueError):
    """A fleet file at `path` that is not a whole, valid message of the kind expected: `reason` in words, counted under
    `category` (a `Refusal`)."""

    def __init__(self, path: str, reason: str, category: Refusal = Refusal.INVALID) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.category = category


def too_large(path: str, size: int | None, max_bytes: int) -> FleetMessageError:
    """The refusal of a file over its kind's bound (`size` None: more bytes came than the bound while reading)."""
    told = f"{size} bytes" if size is not None else "more bytes"
    return FleetMessageError(path, f"{told}, more than the {max_bytes} a message may hold here", Refusal.TOO_LARGE)


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
    temperature: float = Field(
        gt=0, le=10, allow_inf_nan=False, description="Sampling temperature (> 0: a group needs different games)"
    )
    max_turns: int = Field(ge=1, le=6, description="Replies per game before it is cut")
    reply_prefix: str = Field(max_length=64, description="Text that opens each reply, written for the policy")
    examples: ExampleSchedule = Field(
        ExampleSchedule(),
        description="How likely a game's messages show the env's example guess, by the version playing it",
    )


class RunSettings(BaseModel):
    """``fleet/run.json``: the run the trainer is on. Written by the trainer at every change of state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(pattern=ID_PATTERN, description="New at every start of a trainer process")
    state: RunState
    num_generations: int = Field(ge=2, le=64, description="Games per group, all on one seed (GRPO's group)")
    groups_per_step: int = Field(ge=1, le=256, description="Groups one optimizer step trains on")
    max_staleness: int = Field(ge=0, le=10_000, description="Most versions a game's oldest reply may lag the trainer")
    max_pending_groups: int = Field(
        ge=1,
        le=4096,
        description="Back-pressure: servers stop producing while this many groups of the run wait in the bucket",
    )
    sampling: Sampling
    max_game_tokens: int = Field(
        ge=16,
        le=65_536,
        description="Most tokens of one game, prompt and completion: "
        "servers cut a game there, the trainer refuses "
        "longer ones",
    )
    vocab_size: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="Token ids of the run's model are below it (None until the trainer loaded its model)",
    )
    exam: ExamSettings | None = Field(None, description="How the servers examine the policy (None: no exams)")
    lora: LoraSettings | None = Field(
        None,
        description="The LoRA adapter the run trains and how the servers get it "
        "(`wire.lora`; None: the run trains every weight)",
    )
    trainer_version: int = Field(ge=0, le=MAX_VERSION, description="The trainer's weight version when this was written")
    updated_at: float = Field(allow_inf_nan=False, description="Unix time on the trainer's clock (informational)")


class GameGroup(BaseModel):
    """One group of games: `num_generations` games on one seed, played by one rollout server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(pattern=ID_PATTERN)
    server_id: str = Field(pattern=ID_PATTERN)
    boot: str = Field(pattern=ID_PATTERN, description="The server process's start id (a restart gets a new one)")
    seq: int = Field(ge=0, le=MAX_COUNT, description="The group's number within the server process")
    seed: int = Field(ge=-(2**63), lt=2**63, description="The env seed every game of the group was played on")
    games: list[Trajectory] = Field(min_length=1, max_length=64)
    played_s: float = Field(
        ge=0, le=10**7, allow_inf_nan=False, description="Seconds the batch holding this group took to play"
    )
    created_at: float = Field(allow_inf_nan=False, description="Unix time on the server's clock (informational)")

    @model_validator(mode="after")
    def _games_are_whole(self) -> GameGroup:
        for i, game in enumerate(self.games):
            n = len(game.completion_ids)
            if len(game.logprobs) != n or len(game.env_mask) != n:
                raise ValueError(
                    f"game {i}: {n} completion tokens but {len(game.logprobs)} logprobs and "
                    f"{len(game.env_mask)} mask entries"
                )
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


class ServerState(StrEnum):  # str() and f-strings give the value
    """What a rollout server is doing, as its heartbeat says."""

    STARTING = "starting"
    """Started, not yet holding the bucket's versions (loading, or replaying the bucket's deltas after a restart): its
    version is not yet the bucket's."""
    PRODUCING = "producing"
    FULL = "full"
    """Enough groups wait in the bucket for the staleness bound: back-pressure."""
    WAITING = "waiting for step 1"
    """Handed in its groups for the trainer's first step and plays nothing more until that step is published (a
    server sharing the trainer's cores: ``--first-step-alone``)."""
    PAUSED = "paused"
    """The run is paused or stopped."""
    NO_RUN = "no run"
    """No trainer has written a run yet."""
    ERROR = "error"
    """The last attempt failed (the env, the bucket); retrying."""


class Heartbeat(BaseModel):
    """``fleet/servers/<server_id>.json``: a rollout server's state, rewritten every few seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server_id: str = Field(pattern=ID_PATTERN)
    boot: str = Field(pattern=ID_PATTERN)
    beat: int = Field(
        ge=0,
        le=MAX_COUNT,
        description="Counts up with every heartbeat: a reader sees the server "
        "alive while it changes, on the reader's own clock",
    )
    run_id: str | None = Field(None, pattern=ID_PATTERN, description="The run it produces for")
    state: ServerState
    version: int = Field(ge=0, le=MAX_VERSION, description="The weight version it serves")
    games_per_min: float = Field(
        ge=0, le=10**6, allow_inf_nan=False, description="Games written per minute, over the last minutes"
    )
    groups_written: int = Field(ge=0, le=MAX_COUNT, description="Groups written since it started")
    idle_share: float = Field(
        ge=0, le=1, allow_inf_nan=False, description="Share of its time since start with nothing to play"
    )
    last_error: str | None = Field(None, max_length=2000)
    updated_at: float = Field(allow_inf_nan=False, description="Unix time on the server's clock (informational)")
    authenticated: bool | None = Field(
        None,
        description="Whether the server checks the trainer's signature on the weights and run settings it uses "
        "(False: it follows the bucket unauthenticated, whoever wrote it; None: an older server's heartbeat, which "
        "does not say)",
    )
    trusted_key: str | None = Field(
        None,
        pattern=FINGERPRINT_PATTERN,
        description="The fingerprint of the trainer key it checks them with (None: unauthenticated, no key yet, or "
        "an older server)",
    )
    examining: int | None = Field(
        None,
        ge=0,
        le=MAX_VERSION,
        description="The weight version whose exam it plays now (None: none): no other server takes an exam meanwhile",
    )


Message = TypeVar("Message", RunSettings, GameGroup, Heartbeat, ExamRecord)
_ENVELOPE = {"kind", "sha256", "body", "hmac", "signer", "signature", "handovers"}
_KINDS: dict[type[BaseModel], str] = {
    RunSettings: "fleet-run/1",
    GameGroup: "fleet-group/1",
    Heartbeat: "fleet-heartbeat/2",
    ExamRecord: "exam/1",
}
#: Earlier versions of a kind still read, each with the fields its body may not hold (they came after it): a reader
#: of ``fleet-heartbeat/2`` reads an older server's ``fleet-heartbeat/1`` (its trust unknown); a ``fleet-heartbeat/1``
#: reader refuses a ``/2`` in one line ("kind 'fleet-heartbeat/2', expected 'fleet-heartbeat/1'").
_READ_ALSO: dict[type[BaseModel], dict[str, frozenset[str]]] = {
    Heartbeat: {"fleet-heartbeat/1": frozenset({"authenticated", "trusted_key"})},
}


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


def fleet_key(secret: str) -> bytes:
    """The key that signs a run's fleet files, derived from a secret the trainer and its rollout servers share
    (the rollout token): a key of its own, so a signature never reveals or stands for the token itself."""
    return hmac.new(secret.encode(), b"delta-fleet-signing/1", hashlib.sha256).digest()


def _canonical(body: object) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _signature(key: bytes, kind: str, raw: bytes) -> str:
    return hmac.new(key, kind.encode() + b"\n" + raw, hashlib.sha256).hexdigest()


#: What the trainer's Ed25519 signature of a message covers starts with this, then the kind and the canonical body
#: (a line each): never mistaken for a version's signature (`delta.bucket.manifest.SIGNED_VERSION`).
RUN_SIGNED = b"delta-fleet-message/1\n"


def _signed_bytes(kind: str, raw: bytes) -> bytes:
    return RUN_SIGNED + kind.encode() + b"\n" + raw


def encode(
    message: BaseModel,
    key: bytes | None = None,
    signer: SigningKey | None = None,
    handovers: Sequence[Handover] = (),
) -> bytes:
    """The file form of `message`: the envelope with its kind, the hash of its body, with `key` its HMAC, and with
    `signer` (the trainer's key) its Ed25519 signature and the `handovers` that lead to that key."""
    body = message.model_dump(mode="json")
    raw = _canonical(body)
    kind = _KINDS[type(message)]
    envelope: dict[str, object] = {"kind": kind, "sha256": hashlib.sha256(raw).hexdigest(), "body": body}
    if key is not None:
        envelope["hmac"] = _signature(key, kind, raw)
    if signer is not None:
        envelope["signer"] = signer.public.text
        envelope["signature"] = signer.sign(_signed_bytes(kind, raw))
        if handovers:
            envelope["handovers"] = [
                {"old": h.old, "new": h.new, "signature": h.signature} for h in handovers[-MAX_HANDOVERS:]
            ]
    return _canonical(envelope)


def decode(
    data: bytes,
    kind: type[Message],
    path: str = "<message>",
    key: bytes | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    trust: Trust | None = None,
) -> Message:
    """The message in `data`, checked: size (`max_bytes`), JSON, kind, the body's hash, its HMAC with `key` (None: not
    checked), the trainer's signature with `trust` (None: not checked), then every field strictly.

    Raises:
        FleetMessageError: any check failed; the message names the file and what was wrong.
    """
    if len(data) > max_bytes:
        raise too_large(path, len(data), max_bytes)
    try:
        envelope = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FleetMessageError(path, f"not whole JSON (torn or corrupt): {e}", Refusal.DAMAGED) from None
    if not isinstance(envelope, dict) or not {"kind", "sha256", "body"} <= set(envelope) <= _ENVELOPE:
        raise FleetMessageError(
            path,
            "not a fleet message: expected an object with kind, sha256, body (and hmac, signer, signature)",
            Refusal.DAMAGED,
        )
    expected = _KINDS[kind]
    older = _READ_ALSO.get(kind, {})
    if envelope["kind"] != expected and not (isinstance(envelope["kind"], str) and envelope["kind"] in older):
        raise FleetMessageError(path, f"kind {str(envelope['kind'])[:40]!r}, expected {expected!r}")
    if envelope["kind"] != expected:  # an earlier version of the kind: none of the fields that came after it
        later = sorted(older[envelope["kind"]] & set(envelope["body"])) if isinstance(envelope["body"], dict) else []
        if later:
            raise FleetMessageError(path, f"invalid body: {later[0]} is not a field of {envelope['kind']}")
        expected = envelope["kind"]
    try:
        raw = _canonical(envelope["body"])
    except (TypeError, ValueError, RecursionError) as e:
        raise FleetMessageError(path, f"body cannot be hashed: {e}") from None
    if hashlib.sha256(raw).hexdigest() != envelope["sha256"]:
        raise FleetMessageError(path, "the body does not match its sha256 (corrupt or edited)", Refusal.DAMAGED)
    if key is not None:
        signature = envelope.get("hmac")
        if not isinstance(signature, str):
            raise FleetMessageError(
                path,
                "unsigned, and this run signs its files (the rollout token): written by "
                "someone without it, or by a server started without --token",
                Refusal.UNSIGNED,
            )
        if not hmac.compare_digest(signature, _signature(key, expected, raw)):
            raise FleetMessageError(
                path,
                "the signature does not match: forged or edited, or signed with another rollout token",
                Refusal.UNSIGNED,
            )
    if trust is not None:
        from delta import UntrustedVersionError

        signer, signed = envelope.get("signer"), envelope.get("signature")
        handovers = _handovers(envelope.get("handovers", []), path)
        try:
            trust.check(
                signer if isinstance(signer, str) else None,
                signed if isinstance(signed, str) else None,
                _signed_bytes(expected, raw),
                "this file",
                handovers,
            )
        except UntrustedVersionError as e:
            raise FleetMessageError(path, str(e), Refusal.UNTRUSTED) from None
    del envelope  # the body is read again from `raw`, strictly: hold one parse at a time
    try:
        return kind.model_validate_json(raw, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise FleetMessageError(path, f"invalid {where}: {first['msg']}") from None


def _handovers(value: object, path: str) -> tuple[Handover, ...]:
    """The key handovers of an envelope (`encode`), each of the manifest's form; their signatures are checked by
    `delta.Trust.check` (a handover from a key the reader does not trust is never followed)."""
    from delta import DeltaError
    from delta.signing import Handover

    if not isinstance(value, list) or len(value) > MAX_HANDOVERS:
        raise FleetMessageError(path, f"invalid handovers: a list of at most {MAX_HANDOVERS} expected")
    try:
        return tuple(Handover.from_json(h) for h in value)
    except DeltaError as e:
        raise FleetMessageError(path, f"invalid handovers: {e}") from None
