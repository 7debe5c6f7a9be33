"""Bounded game sessions in two pools: token holders' games (``max_sessions``, dropped after ``idle_timeout_s``
without a move) and anonymous visitors' (``public_sessions``, ``per_client`` per address, dropped sooner).
Finished games leave at once for the history."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from wire.env import GameKind, WordleObservation
from wire.wordle import DEFAULT_MAX_INVALID_MOVES

from .errors import InvalidSecretError, SessionExistsError, SessionNotFoundError
from .game import WordleGame
from .history import GameHistory
from .pool import SessionPool
from .rewards import DEFAULT_REWARDS, RewardConfig
from .words import WordLists


@dataclass(frozen=True)
class SessionLimits:
    """How many games may run at once and how long an idle one is kept, for the env token's holders
    (the rollout's games) and, separately, for anonymous visitors, so these can never crowd out those."""

    max_sessions: int = 1024
    """Live games of token holders (and in-process callers) at most; one more is refused (HTTP 503)."""
    idle_timeout_s: float = 600.0
    """A token holder's game with no move for this long is dropped and its slot freed."""
    public_sessions: int = 256
    """Live games of anonymous visitors at most, all of them together (HTTP 503 past it)."""
    per_client: int = 4
    """Live games of one anonymous visitor (by address) at most (HTTP 429 past it)."""
    public_idle_s: float = 180.0
    """An anonymous visitor's game with no move for this long is dropped."""

    def __post_init__(self) -> None:
        for name in ("max_sessions", "public_sessions", "per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "public_idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


DEFAULT_LIMITS = SessionLimits()


class SessionStore:
    """Live games by episode id, shared by the HTTP API and the UI. One lock guards every operation; expired games are
    swept whenever a game starts or is looked up (no background thread). `clock`: monotonic seconds (a test's own)."""

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
        self._lock = threading.Lock()
        self._trusted = SessionPool(limits.max_sessions, limits.idle_timeout_s, None, clock)
        self._public = SessionPool(limits.public_sessions, limits.public_idle_s, limits.per_client, clock)

    @property
    def active(self) -> int:
        """Live games right now, both pools (expired ones are swept first)."""
        with self._lock:
            self._sweep()
            return len(self._trusted) + len(self._public)

    def start(
        self,
        *,
        player: str,
        seed: int | None = None,
        secret: str | None = None,
        episode_id: str | None = None,
        max_invalid_moves: int | None = DEFAULT_MAX_INVALID_MOVES,
        client: str | None = None,
        examples: float = 1.0,
        exam: int | None = None,
        kind: GameKind = GameKind.PLAY,
    ) -> WordleObservation:
        """Start a game and return its first observation (the instructions).

        Args:
            player: who plays, for the history: ``"human"`` or :func:`~wire.env.player_label`.
            seed: picks the secret reproducibly; ignored when ``secret`` is given.
            secret: play this allowed word instead of a random answer.
            episode_id: the session id to use; a fresh UUID when None.
            max_invalid_moves: see :class:`~env_space.game.WordleGame`.
            client: an anonymous visitor's address (the public pool, per-client cap); None for token holders.
            examples: the probability that a message shows an example guess: 1 every message, 0 none.
            exam: play the exam's held-out secret with this number (recorded as an exam game); not with ``secret``.
            kind: why the game is played, as the history records it (`GameKind`).

        Raises:
            ServerFullError: the game's pool is full.
            ClientLimitError: ``client`` already has ``per_client`` live games.
            SessionExistsError: ``episode_id`` is already live.
            InvalidSecretError: ``secret`` is not an allowed word, or ``exam`` is given with a secret or numbers no
                held-out secret.
        """
        episode_id = episode_id or uuid.uuid4().hex
        if exam is not None:
            held_out = self.words.exam_secrets
            if secret is not None or not 0 <= exam < len(held_out):
                raise InvalidSecretError(
                    f"exam {exam}",
                    f"an exam game names one of the {len(held_out)} held-out "
                    "secrets by its number (0 first), and no secret",
                )
            secret = held_out[exam]
        game = WordleGame(
            secret or self.words.pick_secret(seed),
            self.words,
            episode_id=episode_id,
            player=player,
            max_invalid_moves=max_invalid_moves,
            rewards=self._rewards,
            examples=examples,
            kind=GameKind.EXAM if exam is not None else kind,
        )
        pool = self._trusted if client is None else self._public
        with self._lock:
            self._sweep()
            if episode_id in self._trusted or episode_id in self._public:
                raise SessionExistsError(episode_id)
            pool.admit(client)
            pool.add(episode_id, game, client)
        return game.observe()

    def step(self, episode_id: str, text: str) -> WordleObservation:
        """Play one move; a finished game leaves the store for the history.

        Raises:
            SessionNotFoundError: when no live game has this id.
        """
        with self._lock:
            game, pool = self._live(episode_id)
            observation = game.step(text)
            if game.done:
                pool.pop(episode_id)
            else:
                pool.touch(episode_id)
        if observation.done:
            self.history.add(game.record())
        return observation

    def observe(self, episode_id: str) -> WordleObservation:
        """The current observation of a live game (does not count as activity)."""
        with self._lock:
            return self._live(episode_id)[0].observe()

    def close(self, episode_id: str) -> None:
        """End a live game early, freeing its slot: a policy game that made moves is recorded as unfinished (as the
        rollout's feed shows it); a person's abandoned game is not recorded.

        Raises:
            SessionNotFoundError: when no live game has this id.
        """
        with self._lock:
            self._sweep()
            game = self._trusted.pop(episode_id) or self._public.pop(episode_id)
        if game is None:
            raise SessionNotFoundError(episode_id)
        record = game.record()
        if record.is_policy and record.replies:
            self.history.add(record)

    def discard(self, episode_id: str) -> bool:
        """Drop a live game without recording it, for callers that do not care whether it was still
        live (it may have finished or expired). Returns whether a game was dropped."""
        with self._lock:
            self._sweep()
            return (self._trusted.pop(episode_id) or self._public.pop(episode_id)) is not None

    def _live(self, episode_id: str) -> tuple[WordleGame, SessionPool]:
        self._sweep()
        for pool in (self._trusted, self._public):
            game = pool.get(episode_id)
            if game is not None:
                return game, pool
        raise SessionNotFoundError(episode_id)

    def _sweep(self) -> None:
        self._trusted.sweep()
        self._public.sweep()
