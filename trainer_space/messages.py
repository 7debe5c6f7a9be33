"""What the trainer Space's HTTP API answers: its status, its history of steps and payloads, control.

The routes return these models (FastAPI's response models, shown at ``/docs``); the session keeps its
step records and the payload log its payloads as these models, so the history is served as kept.
Pydantic only: light to import (the launcher's landing page reads `TrainerStatus` without loading
torch; the package's ``__init__`` loads the session only when it is asked for).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


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


class TrainerStatus(BaseModel):
    """The answer of ``GET /status``."""

    state: TrainerState
    version: int = Field(description="The last version committed to the bucket (0 before any)")
    trainer_version: int | None = Field(description="The version of the weights in memory (ahead of `version` "
                                                    "while a publish is in flight); None before the model is loaded")
    state_hash: str | None = Field(description="Hash of the last committed version's weights, as the manifest "
                                               "records it")
    resumed_from: int | None = Field(description="The bucket version loaded at start, after a resume")
    resumed_hash: str | None = Field(description="Hash of the weights after that load (equal to the manifest's)")
    step: int = Field(description="Optimizer steps this session (all runs)")
    max_steps: int = Field(description="Steps of one run")
    mean_reward: float | None = Field(description="Mean env reward of the last step's games (None: all dropped)")
    win_rate: float | None = Field(description="Share of the last step's games won")
    valid_rate: float | None = Field(description="Mean share of a game's moves the env scored as valid guesses, "
                                                 "last step")
    letters: float | None = Field(None, description="Mean letters found per game (greens + yellows / 2 of its best "
                                                    "guess, 0-5), last step")
    max_turns: int = Field(6, description="Moves per training game: games are cut there (unfinished)")
    recent: list[StepRecord] = Field([], description="The last steps (at most 20), oldest first: the landing page's "
                                                     "trend")
    step_s: float | None = Field(description="Seconds of the last step, rollouts included")
    max_staleness: int = Field(description="Versions a game may lag the trainer before it is replayed")
    staleness: Staleness | None = Field(description="None before the model is loaded")
    bucket: str
    rollout_url: str
    env_url: str | None
    model: str
    device: str = Field(description="Where the weights train (cpu, cuda)")
    error: str | None = Field(description="What ended the last run, if an error did")
    rollout_error: str | None = Field(description="The last failed rollout request, with its time (kept after "
                                                  "recovery)")
    rollout_failing: int = Field(description="Failed rollout requests in a row now (0 once one succeeds)")


class StepRecord(BaseModel):
    """One optimizer step, as the UI plots it and ``GET /history`` lists it."""

    model_config = ConfigDict(frozen=True)

    step: int = Field(description="Steps this session (all runs)")
    version: int = Field(description="The version this step produced")
    reward: float | None = Field(description="Mean env reward of the step's games (dropped ones excluded; None "
                                             "if all were dropped)")
    win_rate: float | None = Field(description="Fraction of the step's games won (None likewise)")
    valid_rate: float | None = Field(description="Mean share of a game's moves the env scored as valid guesses "
                                                 "(None likewise)")
    letters: float | None = Field(None, description="Mean letters found per game: greens + yellows / 2 of its best "
                                                    "guess, 0-5 (None likewise)")
    step_s: float = Field(description="Seconds of the whole step (rollouts included)")
    cpu_s: float = Field(description="CPU seconds this process spent in the step, all threads (the publisher's "
                                     "included)")
    publish_s: float = Field(description="Seconds publish() blocked the step (the snapshot copy)")
    at: float = Field(description="Unix time")


class Payload(BaseModel):
    """What one committed delta cost, against the alternatives."""

    model_config = ConfigDict(frozen=True)

    version: int = Field(description="The version it produces")
    delta_bytes: int = Field(description="Its file(s), as written with the publisher's codec")
    raw_bytes: int = Field(description="The same changes in the raw layout: (4 + itemsize) bytes per changed "
                                       "element")
    dense_bytes: int = Field(description="The whole state (what shipping full weights costs)")
    changed: int = Field(description="Changed elements")
    total: int = Field(description="Elements in the state")
    at: float = Field(description="Unix time it was measured (shortly after its commit)")


class TrainerHistory(BaseModel):
    """The answer of ``GET /history``: every step and every delta's cost, oldest first."""

    steps: list[StepRecord]
    payloads: list[Payload]


class ControlResponse(BaseModel):
    """The answer of ``POST /control``: the state the action led to."""

    state: TrainerState
