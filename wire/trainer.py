"""What the trainer Space's HTTP API answers: its status, its history of steps and payloads, control.

The routes return these models (FastAPI's response models, shown at ``/docs``); the session keeps its
step records and the payload log its payloads as these models, so the history is served as kept.
Pydantic only: light to import (the launcher's landing page reads `TrainerStatus` without loading
torch; ``trainer_space``'s ``__init__`` loads the session only when it is asked for).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from .curriculum import ExampleSchedule
from .exam import ExamRecord, ExamSettings
from .lora import LoraSettings
from .traffic import BucketTraffic


class TrainerState(str, Enum):
    """What `TrainerStatus.state` says (a str, so it reads and serialises as its value)."""

    RUNNING = "running"
    """Training, or loading the model before the first step, or waiting out a failing rollout."""
    PAUSED = "paused"
    """Held at the end of a step (or before the first) until `start`."""
    STOPPED = "stopped"
    """Not running: never started, stopped by the owner, done, or ended by an error (`error`)."""

    def __str__(self) -> str:
        return self.value


class Staleness(BaseModel):
    """How stale the games trained on were: running totals since the session started."""

    model_config = ConfigDict(frozen=True)

    games: int = Field(0, description="Games accepted into a training step")
    replayed: int = Field(0, description="Stale games played again (each replay counted once)")
    dropped: int = Field(0, description="Games still stale after the replays: kept out of the gradient")
    max_seen: int = Field(0, description="Largest staleness of an accepted game, in versions")
    refused: int = Field(0, description="Game groups refused (fleet): from another run, torn, corrupt or invalid")


class FleetServer(BaseModel):
    """One rollout server of the fleet, as its last heartbeat in the bucket says."""

    model_config = ConfigDict(frozen=True)

    id: str
    version: int = Field(description="The weight version it serves")
    games_per_min: float = Field(description="Games it wrote per minute, recently")
    last_seen_s: float = Field(description="Seconds since its heartbeat last changed (on the trainer's clock)")
    state: str = Field(
        description="starting, producing, full (back-pressure), waiting for step 1, paused, no run, error, or gone "
        "(silent for longer than the trainer waits)"
    )
    idle_share: float = Field(description="Share of its time with nothing to play")
    groups_written: int
    run_id: str | None
    last_error: str | None
    authenticated: bool | None = Field(
        None,
        description="Whether it checks the trainer's signature on the weights and run settings it uses (False: it "
        "follows the bucket unauthenticated; None: its heartbeat does not say, an older server's)",
    )
    trusted_key: str | None = Field(
        None, description="The fingerprint of the trainer key it checks them with (None: none, or not said)"
    )
    trusts_trainer: bool | None = Field(
        None,
        description="Whether that key is this trainer's (or the one it handed over from); None: no key to compare",
    )

    @property
    def weights(self) -> tuple[str, bool]:
        """What the fleet table says of the weights it plays with, and whether that is a warning: "checked" (signed by
        this trainer), "UNAUTHENTICATED", "another key SHA256:…" (it trusts someone else: it refuses this trainer's
        weights), "no key yet" (it trusts the first signed version it reads), "—" (an older server's heartbeat)."""
        if self.authenticated is None:
            return "—", False
        if not self.authenticated:
            return "UNAUTHENTICATED", True
        if self.trusted_key is None:
            return "no key yet", False
        if self.trusts_trainer is False:
            return f"another key {self.trusted_key[:19]}…", True
        return "checked", False


class TrainerStatus(BaseModel):
    """The answer of ``GET /status``."""

    state: TrainerState
    version: int = Field(description="The last version committed to the bucket (0 before any)")
    trainer_version: int | None = Field(
        description="The version of the weights in memory (ahead of `version` "
        "while a publish is in flight); None before the model is loaded"
    )
    state_hash: str | None = Field(
        description="Hash of the last committed version's weights, as the manifest records it"
    )
    resumed_from: int | None = Field(description="The bucket version loaded at start, after a resume")
    resumed_hash: str | None = Field(description="Hash of the weights after that load (equal to the manifest's)")
    step: int = Field(
        description="Optimizer steps whose weights `version` holds: this process's runs and, from "
        "the history in the bucket, the trainer processes before it (shown beside "
        "`version`, so the two move together)"
    )
    max_steps: int = Field(description="Steps of one run")
    last_step: int = Field(
        0, description="The step the current (or next) run ends at: the steps before it plus `max_steps`"
    )
    mean_reward: float | None = Field(description="Mean env reward of the last step's games (None: all dropped)")
    win_rate: float | None = Field(description="Share of the last step's games won")
    valid_rate: float | None = Field(
        description="Mean share of a game's moves the env scored as valid guesses, last step"
    )
    letters: float | None = Field(
        None, description="Mean letters found per game (greens + yellows / 2 of its best guess, 0-5), last step"
    )
    max_turns: int = Field(6, description="Moves per training game: games are cut there (unfinished)")
    recent: list[StepRecord] = Field(
        [], description="The last steps (at most 20), oldest first: the landing page's trend"
    )
    step_s: float | None = Field(description="Seconds of the last step, rollouts included")
    max_staleness: int = Field(
        description="Versions a game may lag the trainer before it is replayed (request mode) or dropped (fleet)"
    )
    staleness: Staleness | None = Field(description="None before the model is loaded")
    bucket: str
    mode: str = Field(
        description="fleet (games from any number of rollout servers, through the bucket) or request "
        "(POST /rollout to one rollout server)"
    )
    rollout_url: str | None = Field(description="The rollout server asked for games (request mode); None in a fleet")
    run_id: str | None = Field(description="The fleet run this trainer process writes (None in request mode)")
    groups_refused: dict[str, int] = Field(
        {},
        description="Game groups refused (fleet), by reason: another run, torn "
        "or corrupt, unsigned or forged, too large, invalid fields, "
        "token id out of the vocabulary, not the run's shape, "
        "version ahead of the trainer, renamed or copied, "
        "unexpected error",
    )
    heartbeats_refused: dict[str, int] = Field(
        {}, description="Heartbeat files refused (fleet), by reason, each file once per reason"
    )
    exams_refused: dict[str, int] = Field(
        {},
        description="Exam files in the bucket refused, by why: 'signed with "
        "another token' (unsigned, or an earlier start's rollout "
        "token), torn or corrupt, too large, invalid fields, "
        "renamed or copied, version ahead of the trainer (of a "
        "version the bucket has not published); a file deleted or "
        "repaired drops out",
    )
    signed: bool = Field(
        False,
        description="The fleet's files are signed with a key from the rollout token (fleet): "
        "unsigned or forged ones are refused",
    )
    waiting_for_rollouts: bool = Field(description="A step is waiting for game groups (fleet)")
    held: bool = Field(
        False, description="A paused run holds between two steps: the step in flight at the pause has ended"
    )
    groups_ready: int = Field(description="Valid, fresh groups waiting in the bucket, as last seen (fleet)")
    groups_needed: int = Field(description="Groups one step takes")
    fleet: list[FleetServer] = Field(description="The rollout servers whose heartbeats are in the bucket (fleet)")
    env_url: str | None
    model: str
    device: str = Field(description="Where the weights train (cpu, cuda)")
    error: str | None = Field(description="What ended the last run, if an error did")
    rollout_error: str | None = Field(
        description="The last failed rollout request, with its time (kept after recovery)"
    )
    rollout_failing: int = Field(description="Failed rollout requests in a row now (0 once one succeeds)")
    bucket_traffic: BucketTraffic | None = Field(
        None,
        description="Requests the trainer sent to its bucket, by class, "
        "per 5 minutes and in all, and whether the "
        "bucket's server asked it to slow down",
    )
    examples: ExampleSchedule = Field(
        ExampleSchedule(),
        description="How likely the training games' messages show the env's example guess, by version",
    )
    exam: ExamSettings | None = Field(None, description="How the rollout servers examine the policy (None: no exams)")
    exams: list[ExamRecord] = Field(
        [],
        description="The latest exams in the bucket (at most 20), by version: the landing page's last exam and trend",
    )
    lora: LoraSettings | None = Field(
        None,
        description="The LoRA adapter the run trains and how it is published "
        "(None: every weight trains, or the model is not loaded yet)",
    )
    trainable: int | None = Field(
        None,
        ge=0,
        description="Parameters the optimizer trains (a LoRA run: the adapter's, once the first run wrapped the model)",
    )
    parameters: int | None = Field(
        None, ge=0, description="Parameters of the model, adapter included (None until loaded)"
    )


#: Where TRL's logs hold a step's importance weights (`offpolicy.OffPolicyGRPOTrainer` logs ours there):
#: ``{IMPORTANCE_METRIC}/mean``, ``/min``, ``/max``.
IMPORTANCE_METRIC = "sampling/importance_sampling_ratio"


class StepRecord(BaseModel):
    """One optimizer step, as the UI plots it and ``GET /history`` lists it."""

    model_config = ConfigDict(frozen=True)

    step: int = Field(
        description="Steps since the run's first (the history in the bucket carries the count "
        "across restarts of the trainer)"
    )
    version: int = Field(description="The version this step produced")
    reward: float | None = Field(
        description="Mean env reward of the step's games (dropped ones excluded; None if all were dropped)"
    )
    win_rate: float | None = Field(description="Fraction of the step's games won (None likewise)")
    valid_rate: float | None = Field(
        description="Mean share of a game's moves the env scored as valid guesses (None likewise)"
    )
    letters: float | None = Field(
        None, description="Mean letters found per game: greens + yellows / 2 of its best guess, 0-5 (None likewise)"
    )
    step_s: float = Field(description="Seconds of the whole step (rollouts included)")
    cpu_s: float = Field(
        description="CPU seconds this process spent in the step, all threads (the publisher's included)"
    )
    publish_s: float = Field(description="Seconds publish() blocked the step (the snapshot copy)")
    wait_s: float | None = Field(
        None,
        description="Seconds the step waited for its games: for groups in the bucket "
        "(fleet), for the rollout's answer (request mode)",
    )
    groups: list[str] = Field([], description="The bucket paths of the game groups trained on (fleet)")
    staleness: dict[int, int] = Field({}, description="Versions behind the trainer -> games trained on")
    dropped: int = Field(0, description="Games dropped as too stale while this step gathered its groups")
    examples_shown: float | None = Field(
        None,
        description="Share of the replies trained on whose message showed the "
        "env's example guess: how much of valid_rate can be a copy "
        "(None: not recorded)",
    )
    straddled: int = Field(
        0, description="Replies of the step's games whose tokens were sampled by more than one weight version"
    )
    versions_reported: bool | None = Field(
        None,
        description="Whether the rollout servers reported each token's weight version (vLLM's weight-version spans); "
        "False: versions per reply; None: not recorded",
    )
    examples_scheduled: float | None = Field(
        None,
        description="What the run's schedule gave those replies' messages: the mean, over the replies trained on, of "
        "the probability their game was played with (the version that started it, in the fleet; the one sent with "
        "the request, in request mode). `examples_shown` is a draw around it (None: not recorded)",
    )
    ratio_mean: float | None = Field(
        None, description="Mean importance weight of the step's model tokens (current policy / sampler, truncated)"
    )
    ratio_min: float | None = Field(None, description="Smallest importance weight")
    ratio_max: float | None = Field(None, description="Largest importance weight (at most the cap)")
    at: float = Field(description="Unix time")


class Payload(BaseModel):
    """What one committed delta cost, against the alternatives."""

    model_config = ConfigDict(frozen=True)

    version: int = Field(description="The version it produces")
    delta_bytes: int = Field(description="Its file(s), as written with the publisher's codec")
    raw_bytes: int = Field(description="The same changes in the raw layout: (4 + itemsize) bytes per changed element")
    dense_bytes: int = Field(description="The whole state (what shipping full weights costs)")
    changed: int = Field(description="Changed elements")
    total: int = Field(description="Elements in the state")
    at: float = Field(description="Unix time it was measured (shortly after its commit)")


class Anchor(BaseModel):
    """A version committed as a full copy of the weights (the first one, then every N versions)."""

    model_config = ConfigDict(frozen=True)

    version: int
    bytes: int = Field(description="Its file(s)")
    at: float = Field(description="Unix time it was seen committed")


class TrainerHistory(BaseModel):
    """The answer of ``GET /history``: every step, every delta's cost and every anchor, oldest first; the same
    records, kept in the bucket (`wire.history`), survive a restart of the trainer."""

    steps: list[StepRecord]
    payloads: list[Payload]
    anchors: list[Anchor] = []
    exams: list[ExamRecord] = Field([], description="Every exam in the bucket, by version")
    exams_refused: dict[str, int] = Field(
        {},
        description="Exam files in the bucket refused, by reason (as in "
        "`TrainerStatus`); not kept in the bucket's history file",
    )


class ControlResponse(BaseModel):
    """The answer of ``POST /control``: the state the action led to."""

    state: TrainerState
