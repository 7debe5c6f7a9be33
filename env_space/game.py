"""One Wordle episode: parse a move, check it, score it, reward it, and say what happened."""

from __future__ import annotations

import re
import time

from wire.env import MAX_REPLY_CHARS, GameKind, GameRecord, GuessRow, WordleObservation
from wire.wordle import (
    DEFAULT_MAX_INVALID_MOVES,
    MAX_GUESSES,
    OPEN_TAG,
    encode,
    is_win,
    progress,
    reply_excerpt,
    score,
)

from . import prompt
from .curriculum import shows_example
from .errors import GameOverError, InvalidSecretError
from .rewards import DEFAULT_REWARDS, RewardConfig, guess_reward, invalid_move_reward
from .words import WordLists


class WordleGame:
    """A single game against a fixed secret, usable without any server.

    Not thread-safe: callers serialise moves (the session store holds a lock). Invalid moves
    (no guess found, not an allowed word, a word already guessed) do not use up a guess, but each costs
    a penalty, and the game is lost at the first invalid move beyond ``max_invalid_moves`` (None: no limit).

    ``examples`` is the probability that a message shows an example guess (1: every message, as for people;
    0: none, as in an exam); which messages do is drawn from the secret and the move's number
    (`env_space.curriculum`). Every scored word is marked ``copied`` when a message of this game showed it
    before that move (an example, a word of the instructions or of the feedback).

    Example:
        >>> game = WordleGame("crane", load_word_lists(), episode_id="e1", player="human")
        >>> game.step("<guess>crate</guess>").rows[0].marks
        'GGGXG'
    """

    def __init__(
        self,
        secret: str,
        words: WordLists,
        *,
        episode_id: str,
        player: str,
        max_invalid_moves: int | None = DEFAULT_MAX_INVALID_MOVES,
        rewards: RewardConfig = DEFAULT_REWARDS,
        examples: float = 1.0,
        kind: GameKind = GameKind.PLAY,
    ) -> None:
        reason = words.check(secret.lower())
        if reason is not None:
            raise InvalidSecretError(secret, reason)
        if max_invalid_moves is not None and max_invalid_moves < 0:
            raise ValueError(f"max_invalid_moves must be >= 0 or None, got {max_invalid_moves}")
        if not 0 <= examples <= 1:
            raise ValueError(f"examples is a probability in [0, 1], got {examples}")
        self.secret = secret.lower()
        self.episode_id = episode_id
        self.player = player
        self.examples = examples
        self.kind = kind
        self._words = words
        self._rewards = rewards
        self._max_invalid = max_invalid_moves
        self._rows: list[GuessRow] = []
        self._best_progress = 0.0
        self._invalid = 0
        self._won = False
        self._steps = 0
        self._total = 0.0
        self._last_reward: float | None = None
        self._last_error: str | None = None
        self._example: str | None = prompt.FIRST_EXAMPLE if shows_example(self.secret, 0, examples) else None
        self._message = prompt.instructions(self._example)
        self._shown = _words_of(self._message)
        self._copied: list[bool] = []
        self._examples: list[str] = []
        self._replies: list[str] = []
        self._guesses: list[str] = []
        self._errors: list[str] = []

    @property
    def won(self) -> bool:
        return self._won

    @property
    def done(self) -> bool:
        return self.won or len(self._rows) >= MAX_GUESSES or self._too_many_invalid

    @property
    def _too_many_invalid(self) -> bool:
        return self._max_invalid is not None and self._invalid > self._max_invalid

    def step(self, text: str) -> WordleObservation:
        """Play one move given as free text (a model reply or a typed word).

        Raises:
            GameOverError: if the game has already ended.
        """
        if self.done:
            raise GameOverError(self.episode_id)
        self._steps += 1
        parsed = prompt.parse_guess(text)
        error = parsed.error or self._words.check(parsed.word or "") or self._repeated(parsed.word or "")
        if error is not None and parsed.left_open and parsed.word is not None:
            error += f"; the {OPEN_TAG} tag was left open, so its first word is the guess"
        self._replies.append(reply_excerpt(text, MAX_REPLY_CHARS))
        self._examples.append(self._example or "")
        self._guesses.append("" if error is not None else parsed.word or "")
        self._copied.append(error is None and parsed.word in self._shown)
        self._errors.append(error or "")
        if error is not None:
            self._invalid += 1
            self._last_error = error
            self._last_reward = invalid_move_reward(
                parsed.word is not None,
                parsed.tagged,
                self._rewards,
                five_letters=self._words.right_shape(parsed.word or ""),
            )
            lines = [prompt.invalid_line(error)]
        else:
            word = parsed.word or ""
            marks = score(word, self.secret)
            self._rows.append(GuessRow(word=word, marks=encode(marks)))
            self._last_error = None
            self._last_reward = guess_reward(
                marks,
                self._best_progress,
                MAX_GUESSES - len(self._rows),
                parsed.tagged,
                self._rewards,
                own=not self._copied[-1],
            )
            self._best_progress = max(self._best_progress, progress(marks))
            self._won = is_win(marks)
            lines = [prompt.feedback_line(word, marks)]
        self._total += self._last_reward
        if self.done:
            self._example = None
            lines.append(prompt.result_text(self.won, self.secret, len(self._rows), self._too_many_invalid))
        else:
            shown = shows_example(self.secret, self._steps, self.examples)
            self._example = (
                self._words.example(self.secret, self._steps, [r.word for r in self._rows]) if shown else None
            )
            lines.append(prompt.next_move_text(MAX_GUESSES - len(self._rows), self._example))
        self._message = "\n".join(lines)
        self._shown |= _words_of(self._message)
        return self.observe()

    def _repeated(self, word: str) -> str | None:
        """A word already on the board tells nothing new, so it is refused like any invalid move: a person
        keeps the row, and a policy that writes one word every turn (small models copy the instructions'
        example) is penalised for it instead of scoring it as a valid guess."""
        return f"{word.upper()} was already guessed" if any(row.word == word for row in self._rows) else None

    def observe(self) -> WordleObservation:
        """The current observation; the secret shows only once the game is over."""
        return WordleObservation(
            episode_id=self.episode_id,
            player=self.player,
            message=self._message,
            rows=list(self._rows),
            guesses_left=MAX_GUESSES - len(self._rows),
            invalid_moves=self._invalid,
            step_count=self._steps,
            last_move_valid=None if self._steps == 0 else self._last_error is None,
            error=self._last_error,
            won=self.won,
            secret=self.secret if self.done else None,
            total_reward=_rounded(self._total),
            done=self.done,
            reward=None if self._last_reward is None else _rounded(self._last_reward),
            example=self._example,
            copied=self._copied[-1] if self._copied and self._guesses[-1] else None,
        )

    def record(self) -> GameRecord:
        """The game as the history keeps it (``finished`` False while it is still live)."""
        return GameRecord(
            episode_id=self.episode_id,
            player=self.player,
            words=tuple(r.word for r in self._rows),
            marks=tuple(r.marks for r in self._rows),
            won=self.won,
            secret=self.secret,
            invalid_moves=self._invalid,
            total_reward=_rounded(self._total),
            finished_at=time.time(),
            finished=self.done,
            replies=tuple(self._replies),
            guesses=tuple(self._guesses),
            errors=tuple(self._errors),
            examples=tuple(self._examples),
            copied=tuple(self._copied),
            kind=self.kind,
        )


def _rounded(value: float) -> float:
    """A reward to 6 decimals, never -0.0: a sum such as -0.2 - 0.1 + 0.3 rounds to it, and pages showed "-0.0"."""
    return round(value, 6) + 0.0


def _words_of(text: str) -> set[str]:
    """The lowercase words of a message, as a player could copy them."""
    return set(re.findall(r"[a-z]+", text.lower()))
