"""The env Space's HTTP messages, shaped like OpenEnv's: an action, an observation that carries ``done`` and
``reward``, the request bodies of the HTTP API, and its answers (the step response, finished games
and win rates per player, whose ``player`` labels are defined here too)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

from webguard import MAX_INT63, RequestBody

from .exam import HELD_OUT_SECRETS, ExamScores
from .wordle import DEFAULT_MAX_INVALID_MOVES

MAX_ACTION_CHARS = 32_768
"""Longest model output accepted as one action; the parser only needs the end of a reply."""
MAX_REPLY_CHARS = 240
"""Characters of each move's text a `GameRecord` keeps, around its guess (`wire.wordle.reply_excerpt`; a reply can be
1000 tokens)."""
HUMAN = "human"
POLICY = "policy"
_PLAYER = "'human', 'policy vN' (weight version N) or 'policy'"


def weight_version_of(player: str) -> int | None:
    """The N of ``"policy vN"``; None for people and for policies of unknown version."""
    version = player.removeprefix(f"{POLICY} v")
    return int(version) if version != player and version.isdigit() else None


def player_label(weight_version: int | None) -> str:
    """``"policy vN"`` for a policy at weight version N; plain ``"policy"`` when the client did not
    say which version played."""
    if weight_version is None:
        return POLICY
    if weight_version < 0:
        raise ValueError(f"weight_version must be >= 0, got {weight_version}")
    return f"{POLICY} v{weight_version}"


class GameKind(str, Enum):
    """Why a game was played, as its client says at reset: what the pages count it as. Each kind has its own label in
    the feeds, its own series in the env's win-rate chart and its own rows in its table, since they are played by
    different rules (a training game is cut after a few moves, a showcase game is played whole, an exam game shows no
    example) and a count that mixes them says nothing."""

    TRAINING = "training"
    """Played for a trainer (the fleet's groups, the rollout's ``/rollout``): the only games trained on."""
    EXAM = "exam"
    """An exam game: a held-out secret, no example, never trained on (`ResetRequest.exam`)."""
    SHOWCASE = "showcase"
    """A rollout server's game for its page (when idle, or a visitor's "let the policy play"): played whole."""
    MATCH = "match"
    """Either side of a person's match against the policy on the rollout's page."""
    PLAY = "play"
    """Nothing more said: a person on the env's page, or a client that names no kind."""

    def __str__(self) -> str:
        return self.value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _EnvRequest(RequestBody):
    """The env's request bodies: the apps' one request model (`webguard.RequestBody`: each field takes its own JSON
    type only), but unknown fields are ignored, as OpenEnv's clients send more."""

    model_config = ConfigDict(extra="ignore")


class WordleAction(RequestBody):
    """One move: free text, such as a model's whole reply or a word typed by a person."""

    guess: str = Field(max_length=MAX_ACTION_CHARS, description="Text holding the guess, e.g. '<guess>crane</guess>'")
    metadata: dict[str, Any] = Field(
        default_factory=dict, max_length=32, description="Ignored; OpenEnv's Action base class sends it"
    )


class GuessRow(_Strict):
    """A scored guess."""

    word: str
    marks: str = Field(description="One code per letter: G green, Y yellow, X gray, e.g. 'GYXXG'")


class StepObservation(_Strict):
    """An observation as ``/reset`` and ``/step`` send it: OpenEnv's step response carries the move's
    ``reward`` and ``done`` beside it (`StepResponse`), not in it."""

    episode_id: str
    player: str = Field(description=_PLAYER)
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
    example: str | None = Field(
        None,
        description="The example guess this message shows (the instructions' for "
        "the first move, a new one in each request after); None once over, "
        "and in a message the session's `examples` left without one",
    )
    copied: bool | None = Field(
        None,
        description="Whether the last move's scored word had been shown by a message "
        "of this game before it (an example, a word of the instructions or "
        "of the feedback): not the player's own; None when no word scored",
    )


class WordleObservation(StepObservation):
    """What a player sees after reset or a move."""

    done: bool = False
    reward: float | None = Field(None, description="Reward of the last move; None after reset")


class ResetRequest(_EnvRequest):
    """Body of ``POST /reset`` (OpenEnv's ``seed`` and ``episode_id``, plus Wordle options). An exam game shows no
    example: with ``exam``, ``examples`` left out means none, and any other value than false or 0 is refused."""

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
    examples: bool | float = Field(
        True,
        description="Whether the session's messages show an example guess: true (every message), false (none: "
        "the policy plays by itself), or the probability that each message shows one, drawn from "
        "the secret and the move's number (a fading curriculum)",
    )
    exam: int | None = Field(
        None,
        ge=0,
        lt=HELD_OUT_SECRETS,
        description="Play the exam's held-out secret number `exam` (a word no "
        "seeded or random game ever gets); the game is recorded as an "
        "exam game",
    )
    kind: GameKind | None = Field(
        None,
        strict=False,  # the JSON string names the enum's member
        description="Why the game is played (training, exam, showcase, match, play), for the pages' counts; "
        "anything but play needs the env token; exam only with `exam`. Left out: exam with `exam`, else play",
    )

    @field_validator("examples")
    @classmethod
    def _probability(cls, value: bool | float) -> bool | float:
        if not isinstance(value, bool) and not 0 <= value <= 1:
            raise ValueError("examples must be true, false or a probability in [0, 1]")
        return value

    @model_validator(mode="after")
    def _exam_alone(self) -> ResetRequest:
        if (self.exam is not None) != (self.game_kind == GameKind.EXAM):
            raise ValueError("an exam game names its held-out secret with exam, and only an exam game is of kind exam")
        if self.exam is not None:
            if "examples" in self.model_fields_set and self.example_probability != 0:
                raise ValueError(
                    f"an exam game shows no examples: send examples: false with exam (got {str(self.examples).lower()})"
                )
            self.examples = False
        return self

    @property
    def example_probability(self) -> float:
        """`examples` as a probability."""
        return float(self.examples)

    @property
    def game_kind(self) -> GameKind:
        """The kind the game is recorded as: `kind`, else exam for an exam game and play for any other."""
        return self.kind or (GameKind.EXAM if self.exam is not None else GameKind.PLAY)


class StepRequest(_EnvRequest):
    """Body of ``POST /step``: OpenEnv's ``action`` plus the session's ``episode_id``."""

    episode_id: str = Field(min_length=1, max_length=255)
    action: WordleAction


class EpisodeRequest(_EnvRequest):
    """Body of ``POST /close``."""

    episode_id: str = Field(min_length=1, max_length=255)


class StepResponse(BaseModel):
    """The answer of ``POST /reset`` and ``POST /step`` (OpenEnv's shape)."""

    observation: StepObservation
    reward: float | None = Field(description="Reward of the move; None after reset")
    done: bool

    @classmethod
    def of(cls, observation: WordleObservation) -> StepResponse:
        """The response for `observation`: its reward and done beside it."""
        return cls(observation=observation, reward=observation.reward, done=observation.done)

    def merged(self) -> WordleObservation:
        """The observation with its reward and done in it, as ``GET /state`` answers."""
        return WordleObservation.model_validate(
            {**self.observation.model_dump(), "reward": self.reward, "done": self.done}
        )


class CloseResponse(BaseModel):
    """The answer of ``POST /close``."""

    episode_id: str
    closed: bool


class GameRecord(BaseModel):
    """One finished game, as ``GET /games`` lists it."""

    model_config = ConfigDict(frozen=True)

    episode_id: str
    player: str = Field(description=_PLAYER)
    words: tuple[str, ...] = Field(description="Scored guesses in order")
    marks: tuple[str, ...] = Field(description="Feedback codes such as 'GYXXG', one per scored guess")
    won: bool
    secret: str
    invalid_moves: int
    total_reward: float
    finished_at: float = Field(description="Unix time")
    finished: bool = Field(
        True, description="False for a policy game its client closed before the env ended it (cut at its turn limit)"
    )
    replies: tuple[str, ...] = Field(
        (),
        description=f"What the player sent for each move, invalid ones included (the {MAX_REPLY_CHARS} characters "
        "around its guess where it was longer)",
    )
    guesses: tuple[str, ...] = Field((), description="The word each move scored, '' for an invalid move")
    errors: tuple[str, ...] = Field((), description="Why each move was invalid ('' for a scored guess)")
    examples: tuple[str, ...] = Field(
        (),
        description="The example guess the message before each move showed: a "
        "move that scored it copied the env's example",
    )
    copied: tuple[bool, ...] = Field(
        (),
        description="Per move, whether it scored a word a message of the game had "
        "shown before it (not the player's own)",
    )
    kind: GameKind = Field(GameKind.PLAY, description="Why it was played, as its client said at reset")

    @property
    def is_policy(self) -> bool:
        return self.player != HUMAN

    @property
    def exam(self) -> bool:
        """An exam game: a held-out secret, played without examples, never trained on."""
        return self.kind == GameKind.EXAM


class PlayerStats(BaseModel):
    """Games and wins of one player label and kind of game, over the whole life of the server (``GET /stats``)."""

    model_config = ConfigDict(frozen=True)

    player: str = Field(description=_PLAYER)
    kind: GameKind = Field(GameKind.PLAY, description="The kind of game counted (`GameKind`): kinds are never mixed")
    games: int
    wins: int

    @computed_field  # type: ignore[prop-decorator]  # pydantic's computed field over a property, as its docs write it
    @property
    def win_rate(self) -> float:
        """Wins per game (0 before any)."""
        return self.wins / self.games if self.games else 0.0

    @property
    def weight_version(self) -> int | None:
        return weight_version_of(self.player)


class ExamInfo(BaseModel):
    """The answer of ``GET /exam``: what the env holds out for exams, and the reference a copying player sets."""

    held_out: int = Field(description="Secrets held out for exams (`ResetRequest.exam` numbers them from 0)")
    games: int = Field(description="The first `games` of them were played for `copying`")
    turns: int = Field(description="Moves per game of `copying`")
    copying: ExamScores = Field(
        description="A player that plays the example word of every message, on those "
        "secrets with examples on: what copying alone scores"
    )
