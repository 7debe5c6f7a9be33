"""The exam: does the policy play Wordle by itself? Its settings, its scores and the record of one exam.

Every `ExamSettings.every` weight versions (and at version 0, the untrained policy), a rollout server plays
the first `games` of the env's held-out secrets (answers no training game ever draws and no message ever
shows: `env_space.words.WordLists.exam_secrets`) with the env's examples off (``examples: false``), and
writes one `ExamRecord` to the bucket (``exams/v<version>.json``, `fleet.exams`). Exam games are never
written as training groups: no exam game is trained on.

The scores count what the policy wrote by itself: the strict valid-guess rate, and the same counting only
its **own** words: a scored word is the policy's own when no message of the game showed it before that move
(not an example, not a word of the instructions or of the feedback, such as GUESS or GREEN; the env says so
per move, `wire.env.GameRecord.copied`).

Pydantic only: light to import (the landing page reads exam records without a UI stack).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .wordle import MAX_GUESSES, letters_found

#: Answers the env holds out for exams: the most games an exam can play.
HELD_OUT_SECRETS = 64
#: Where the exam records live in the bucket, beside the weights and the fleet's files.
EXAMS_PREFIX = "exams/"
#: Most replies an exam game may have: one per guess, and as many invalid moves.
MAX_EXAM_TURNS = 2 * MAX_GUESSES
#: Why an exam record is not read when its signature does not match the reader's key (`fleet.exams`): signed
#: with another rollout token (an earlier start's, another machine's), or edited.
OTHER_KEY = "signed with another token"
_PATH = re.compile(re.escape(EXAMS_PREFIX) + r"v(\d{10})\.json")
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


def exam_path(version: int) -> str:
    """The bucket path of the exam of weight `version`."""
    return f"{EXAMS_PREFIX}v{version:010d}.json"


def path_version(path: str) -> int | None:
    """The version an exam file's name claims (None: not an exam file name)."""
    match = _PATH.fullmatch(path)
    return int(match.group(1)) if match else None


class ExamSettings(BaseModel):
    """How exams are played: part of the run's settings (`wire.fleet.RunSettings.exam`), so every rollout server
    examines alike."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    every: int = Field(5, ge=1, le=10**6, description="An exam every this many weight versions (and one of version 0)")
    games: int = Field(16, ge=1, le=HELD_OUT_SECRETS, description="Held-out secrets played, one game each")
    turns: int = Field(3, ge=1, le=MAX_EXAM_TURNS, description="Replies per exam game (invalid moves count)")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature of the exam (0: greedy)")
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Sampling seed: every exam draws the same random numbers, so two exams differ by the weights only",
    )

    def due(self, version: int, last: int | None) -> bool:
        """Whether weight `version` is to be examined, the last exam in the bucket being of version `last`: at
        version 0, and at the first version held in each later block of `every` versions."""
        if last is None:
            return True
        return version // self.every > last // self.every

    def describe(self) -> str:
        """ "16 held-out words, 3 moves, greedy" for the pages."""
        how = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}"
        return f"{self.games} held-out words, {self.turns} moves a game, {how}, no examples"


class PlayedGame(Protocol):
    """What scoring reads of a game (`wire.trajectory.Trajectory` and `wire.env.GameRecord` have it)."""

    @property
    def guesses(self) -> Sequence[str]: ...

    @property
    def marks(self) -> Sequence[str]: ...

    @property
    def won(self) -> bool: ...

    @property
    def copied(self) -> Sequence[bool]: ...


class ExamScores(BaseModel):
    """What a set of games scored, counted the same way for the policy's exam and for its references."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    games: int = Field(ge=1, le=HELD_OUT_SECRETS)
    moves: int = Field(ge=0, le=HELD_OUT_SECRETS * MAX_EXAM_TURNS, description="Replies, invalid ones included")
    valid_rate: float = Field(
        ge=0,
        le=1,
        description="Strict valid-guess rate: per game, the share of its moves that scored a word, averaged over games",
    )
    own_rate: float = Field(
        ge=0, le=1, description="The same, counting only the policy's own words: the exam's headline figure"
    )
    valid_by_move: list[float] = Field(
        max_length=MAX_EXAM_TURNS,
        description="Per move number, the share of the games that made it whose move scored a word",
    )
    letters: float = Field(
        ge=0, le=5, description="Mean letters found per game (greens + yellows / 2 of its best guess)"
    )
    wins: int = Field(ge=0, le=HELD_OUT_SECRETS)
    win_guesses: float | None = Field(
        None, ge=1, le=MAX_GUESSES, description="Mean guesses of a won game (None without a win)"
    )
    scored: int = Field(ge=0, le=HELD_OUT_SECRETS * MAX_EXAM_TURNS, description="Words scored (valid moves)")
    own: int = Field(ge=0, le=HELD_OUT_SECRETS * MAX_EXAM_TURNS, description="Scored words that were the player's own")
    words: list[str] = Field(
        [], max_length=HELD_OUT_SECRETS * MAX_GUESSES, description="Every scored word, game after game (what it wrote)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ExamScores:
        if any(not 0 <= v <= 1 for v in self.valid_by_move):
            raise ValueError("valid_by_move holds a share outside [0, 1]")
        if not self.own <= self.scored <= self.moves or self.wins > self.games or self.own_rate > self.valid_rate:
            raise ValueError("counts out of order: need own <= scored <= moves, wins <= games, own_rate <= valid_rate")
        if (self.wins == 0) != (self.win_guesses is None):
            raise ValueError("win_guesses is the mean of the won games: set exactly when wins > 0")
        if len(self.words) != self.scored or any(not re.fullmatch(r"[a-z]{5}", w) for w in self.words):
            raise ValueError("words must be the scored words, lowercase, five letters each")
        return self

    @classmethod
    def of(cls, games: Sequence[PlayedGame]) -> ExamScores:
        """Score `games` (at least one). A move is valid when it scored a word (`guesses` holds ''
        otherwise), and the player's own when the env did not mark that word `copied`."""
        if not games:
            raise ValueError("no games to score")
        valid, own, words, own_words = [], [], [], 0
        by_move: dict[int, list[bool]] = {}
        for g in games:
            copied = list(g.copied) + [False] * (len(g.guesses) - len(g.copied))
            moves = max(1, len(g.guesses))
            mine = sum(1 for w, c in zip(g.guesses, copied, strict=False) if w and not c)
            valid.append(sum(1 for w in g.guesses if w) / moves)
            own.append(mine / moves)
            own_words += mine
            words += [w for w in g.guesses if w]
            for k, w in enumerate(g.guesses):
                by_move.setdefault(k, []).append(bool(w))
        won = [len(g.marks) for g in games if g.won]
        return cls(
            games=len(games),
            moves=sum(len(g.guesses) for g in games),
            valid_rate=statistics.fmean(valid),
            own_rate=statistics.fmean(own),
            valid_by_move=[statistics.fmean(by_move[k]) for k in sorted(by_move)],
            letters=statistics.fmean(letters_found(g.marks) for g in games),
            wins=len(won),
            win_guesses=statistics.fmean(won) if won else None,
            scored=len(words),
            own=own_words,
            words=words,
        )


class ExamRecord(BaseModel):
    """One exam of one weight version (``exams/v<version>.json``), written by the rollout server that played it.

    Read from a bucket, it is a stranger's file: `fleet.exams` checks its envelope and every field here."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    version: int = Field(ge=0, le=10**12, description="The weight version examined")
    state_hash: str | None = Field(
        None,
        max_length=128,
        description="Hash of the weights examined, as the rollout server verified them (None: not claimed)",
    )
    server_id: str = Field(pattern=_ID_PATTERN, description="The rollout server that played it")
    settings: ExamSettings
    scores: ExamScores
    copying: ExamScores | None = Field(
        None,
        description="Reference: a player that copies the env's example on "
        "every move, same secrets and moves, examples on",
    )
    played_s: float = Field(ge=0, le=10**6, description="Seconds the exam took to play")
    at: float = Field(ge=0, le=10**11, description="Unix time it was written (the server's clock)")

    @model_validator(mode="after")
    def _whole(self) -> ExamRecord:
        if self.scores.games != self.settings.games:
            raise ValueError(f"{self.scores.games} games scored, the settings say {self.settings.games}")
        return self

    @property
    def path(self) -> str:
        return exam_path(self.version)
