"""Wire types, shaped like OpenEnv's: an action, an observation that carries ``done`` and
``reward``, and the request bodies of the HTTP API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from webguard import MAX_INT63

from .rules import DEFAULT_MAX_INVALID_MOVES

MAX_ACTION_CHARS = 32_768
"""Longest model output accepted as one action; the parser only needs the end of a reply."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WordleAction(_Strict):
    """One move: free text, such as a model's whole reply or a word typed by a person."""

    guess: str = Field(
        max_length=MAX_ACTION_CHARS, description="Text holding the guess, e.g. '<guess>crane</guess>'"
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, max_length=32, description="Ignored; OpenEnv's Action base class sends it"
    )


class GuessRow(_Strict):
    """A scored guess."""

    word: str
    marks: str = Field(description="One code per letter: G green, Y yellow, X gray, e.g. 'GYXXG'")


class WordleObservation(_Strict):
    """What a player sees after reset or a move."""

    episode_id: str
    player: str = Field(description="'human', 'policy vN' (weight version N) or 'policy'")
    message: str = Field(description="Text for the player: the instructions, then feedback on each move")
    rows: list[GuessRow] = Field(default_factory=list)
    guesses_left: int
    invalid_moves: int = 0
    step_count: int = Field(0, description="Moves made, invalid ones included")
    last_move_valid: bool | None = Field(None, description="None before the first move")
    error: str | None = Field(None, description="Why the last move was invalid")
    won: bool = False
    secret: str | None = Field(None, description="Revealed once the game is over")
    total_reward: float = 0.0
    done: bool = False
    reward: float | None = Field(None, description="Reward of the last move; None after reset")


class ResetRequest(BaseModel):
    """Body of ``POST /reset`` (OpenEnv's ``seed`` and ``episode_id``, plus Wordle options)."""

    model_config = ConfigDict(extra="ignore")

    seed: int | None = Field(None, ge=0, le=MAX_INT63, description="Picks the secret reproducibly")
    episode_id: str | None = Field(None, min_length=1, max_length=255, description="Own id for the session")
    secret: str | None = Field(None, max_length=32, description="Play this word instead of a random answer")
    weight_version: int | None = Field(
        None, ge=0, le=MAX_INT63, description="Weight version of the policy playing (needs the env token)"
    )
    human: bool = Field(False, description="A person plays (through another app's UI): recorded as 'human'")
    max_invalid_moves: int | None = Field(
        DEFAULT_MAX_INVALID_MOVES,
        ge=0,
        le=1000,
        description="Invalid moves tolerated before the game is lost; null: no limit",
    )


class StepRequest(BaseModel):
    """Body of ``POST /step``: OpenEnv's ``action`` plus the session's ``episode_id``."""

    model_config = ConfigDict(extra="ignore")

    episode_id: str = Field(min_length=1, max_length=255)
    action: WordleAction


class EpisodeRequest(BaseModel):
    """Body of ``POST /close``."""

    episode_id: str = Field(min_length=1, max_length=255)


def step_response(observation: WordleObservation) -> dict[str, Any]:
    """OpenEnv's response shape: ``{"observation": {...}, "reward": r, "done": d}``."""
    return {
        "observation": observation.model_dump(exclude={"reward", "done"}),
        "reward": observation.reward,
        "done": observation.done,
    }
