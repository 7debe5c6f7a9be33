"""Examples that fade: how likely the env is to show its example word in a training game, as training goes on.

Every request the env sends for a guess can end with an example of the format, a word to copy
(`env_space.prompt`). A small model copies it, learns the format in a few steps, and then plays the env's
words instead of its own. The schedule here takes the crutch away as training goes on: the probability that
a message shows its example falls from 1 to `floor` between two weight versions. It is one rule for every
player of a training session: the trainer writes it into the run's settings (`wire.fleet.Sampling`), and each
rollout server computes a game's probability from the weight version it starts the game with, then tells the
env that probability for the game's session (``examples`` at ``POST /reset``, `wire.env.ResetRequest`); the
env draws each message's example from the game's secret and the move's number (`env_space.curriculum`), so
the games of one GRPO group see the same messages.

Pydantic only: light to import.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ExampleMode(str, Enum):
    """Whether training games show the env's example words: never, always, or less and less."""

    OFF = "off"
    """No example in any message, from the first step (what an exam plays)."""
    FIXED = "fixed"
    """An example in every message (the env's default for a session that says nothing)."""
    FADING = "fading"
    """Every message until `ExampleSchedule.start`, then less and less, down to `floor` at `end`."""

    def __str__(self) -> str:
        return self.value


class ExampleSchedule(BaseModel):
    """The probability that a training game's messages show their example, by the weight version playing.

    ``fading``: 1.0 for versions up to `start`, then falling linearly to `floor` at version `end`, and
    `floor` after it. ``fixed``: always 1.0; ``off``: always 0.0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: ExampleMode = ExampleMode.FADING
    start: int = Field(0, ge=0, le=10**9, description="Last version at which every message shows its example")
    end: int = Field(30, ge=0, le=10**9, description="First version at which the probability is down to floor")
    floor: float = Field(0.0, ge=0, le=1, description="The probability once faded")

    @model_validator(mode="after")
    def _ordered(self) -> ExampleSchedule:
        if self.end < self.start:
            raise ValueError(f"the fading ends (version {self.end}) before it starts (version {self.start})")
        return self

    def probability(self, version: int) -> float:
        """The probability that a message of a game started at weight `version` shows its example."""
        if self.mode == ExampleMode.FIXED:
            return 1.0
        if self.mode == ExampleMode.OFF:
            return 0.0
        if version <= self.start:
            return 1.0
        if version >= self.end:
            return self.floor
        return 1.0 - (1.0 - self.floor) * (version - self.start) / (self.end - self.start)

    def describe(self) -> str:
        """One line for the pages: "fading: every message to v0, none from v30"."""
        if self.mode != ExampleMode.FADING:
            return "shown in every message" if self.mode == ExampleMode.FIXED else "off: never shown"
        last = "none" if self.floor == 0 else f"{100 * self.floor:.0f} % of messages"
        return f"fading: every message up to v{self.start}, {last} from v{self.end}"
