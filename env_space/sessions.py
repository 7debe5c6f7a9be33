"""Bounded game sessions: at most ``max_sessions`` live games, each dropped after ``idle_timeout_s``
without a move. Finished games leave at once and go to the history (who played, and the result)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ServerFullError, SessionExistsError, SessionNotFoundError
from .game import WordleGame
from .history import GameHistory
from .rewards import DEFAULT_REWARDS, RewardConfig
from .rules import DEFAULT_MAX_INVALID_MOVES
from .schema import WordleObservation
from .words import WordLists


@dataclass(frozen=True)
class SessionLimits:
    """How many games may run at once and how long an idle one is kept."""

    max_sessions: int = 1024
    """Live games at most; one more is refused with ServerFullError (HTTP 503)."""
    idle_timeout_s: float = 600.0
    """A game with no move for this long is dropped and its slot freed."""

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0 seconds, got {self.idle_timeout_s}")


DEFAULT_LIMITS = SessionLimits()


class SessionStore:
    """Live games by episode id, shared by the HTTP API and the UI.

    Thread-safe: one lock guards every operation (each is a few microseconds of work). Expired
    games are swept lazily, whenever a game starts or is looked up, so no background thread runs.

    Args:
        words: the word lists games use.
        history: where finished games are recorded.
        limits: the bounds on live games.
        rewards: reward weights for every game.
        clock: monotonic seconds; tests pass a fake one.
    """

    def __init__(
        self,
        words: WordLists,
        history: GameHistory,
        limits: SessionLimits = DEFAULT_LIMITS,
        rewards: RewardConfig = DEFAULT_REWARDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.words = words
        self.history = history
        self.limits = limits
        self._rewards = rewards
        self._clock = clock
        self._lock = threading.Lock()
        # Least recently used first, so expired games sit at the front.
        self._games: OrderedDict[str, tuple[WordleGame, float]] = OrderedDict()

    @property
    def active(self) -> int:
        """Live games right now (expired ones are swept first)."""
        with self._lock:
            self._sweep()
            return len(self._games)

    def start(
        self,
        *,
        player: str,
        seed: int | None = None,
        secret: str | None = None,
        episode_id: str | None = None,
        max_invalid_moves: int | None = DEFAULT_MAX_INVALID_MOVES,
    ) -> WordleObservation:
        """Start a game and return its first observation (the instructions).

        Args:
            player: who plays, for the history: ``"human"`` or :func:`~env_space.history.player_label`.
            seed: picks the secret reproducibly; ignored when ``secret`` is given.
            secret: play this allowed word instead of a random answer.
            episode_id: the session id to use; a fresh UUID when None.
            max_invalid_moves: see :class:`~env_space.game.WordleGame`.

        Raises:
            ServerFullError: when ``max_sessions`` games are live.
            SessionExistsError: when ``episode_id`` is already live.
            InvalidSecretError: when ``secret`` is not an allowed word.
        """
        episode_id = episode_id or uuid.uuid4().hex
        game = WordleGame(
            secret or self.words.pick_secret(seed),
            self.words,
            episode_id=episode_id,
            player=player,
            max_invalid_moves=max_invalid_moves,
            rewards=self._rewards,
        )
        with self._lock:
            self._sweep()
            if episode_id in self._games:
                raise SessionExistsError(episode_id)
            if len(self._games) >= self.limits.max_sessions:
                raise ServerFullError(len(self._games), self.limits.max_sessions)
            self._games[episode_id] = (game, self._clock())
        return game.observe()

    def step(self, episode_id: str, text: str) -> WordleObservation:
        """Play one move; a finished game leaves the store and is recorded in the history.

        Raises:
            SessionNotFoundError: when no live game has this id.
        """
        with self._lock:
            game = self._live(episode_id)
            observation = game.step(text)
            if game.done:
                del self._games[episode_id]
            else:
                self._games[episode_id] = (game, self._clock())
                self._games.move_to_end(episode_id)
        if observation.done:
            self.history.add(game.record())
        return observation

    def observe(self, episode_id: str) -> WordleObservation:
        """The current observation of a live game (does not count as activity)."""
        with self._lock:
            return self._live(episode_id).observe()

    def close(self, episode_id: str) -> None:
        """End a live game early, freeing its slot. A policy game that made moves is recorded as
        unfinished (a rollout cut it at its turn limit), so the env's feed and the rollout's show the
        same games with the same result; a person's abandoned game is not recorded.

        Raises:
            SessionNotFoundError: when no live game has this id.
        """
        with self._lock:
            self._sweep()
            entry = self._games.pop(episode_id, None)
        if entry is None:
            raise SessionNotFoundError(episode_id)
        record = entry[0].record()
        if record.is_policy and record.replies:
            self.history.add(record)

    def discard(self, episode_id: str) -> bool:
        """Drop a live game without recording it, for callers that do not care whether it was still
        live (it may have finished or expired). Returns whether a game was dropped."""
        with self._lock:
            self._sweep()
            return self._games.pop(episode_id, None) is not None

    def _live(self, episode_id: str) -> WordleGame:
        self._sweep()
        try:
            return self._games[episode_id][0]
        except KeyError:
            raise SessionNotFoundError(episode_id) from None

    def _sweep(self) -> None:
        deadline = self._clock() - self.limits.idle_timeout_s
        while self._games:
            _, (_, last_move) = next(iter(self._games.items()))
            if last_move > deadline:
                break
            self._games.popitem(last=False)
