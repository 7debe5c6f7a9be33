"""Who played which game: finished games for the UI feed, and win rates per player."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

HUMAN = "human"
#: Characters of each move's text a record keeps (a reply can be 1000 tokens; the feed shows a line).
MAX_REPLY_CHARS = 240
POLICY = "policy"


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


@dataclass(frozen=True)
class GameRecord:
    """One finished game."""

    episode_id: str
    player: str
    words: tuple[str, ...]
    """Scored guesses in order."""
    marks: tuple[str, ...]
    """Feedback codes such as ``"GYXXG"``, one per guess."""
    won: bool
    secret: str
    invalid_moves: int
    total_reward: float
    finished_at: float
    """Unix time."""
    finished: bool = True
    """False for a policy game its client closed before the env ended it (cut at its turn limit)."""
    replies: tuple[str, ...] = ()
    """What the player sent for each move, invalid ones included (cut at ``MAX_REPLY_CHARS``)."""
    guesses: tuple[str, ...] = ()
    """The word each move scored, ``""`` for an invalid move."""

    @property
    def is_policy(self) -> bool:
        return self.player != HUMAN


@dataclass(frozen=True)
class PlayerStats:
    """Games and wins of one player label, over the whole life of the server."""

    player: str
    games: int
    wins: int

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0

    @property
    def weight_version(self) -> int | None:
        return weight_version_of(self.player)


class GameHistory:
    """Thread-safe log of finished games: the latest ``keep`` in full, counts for all of them.

    ``finished`` only grows; a UI polls it as a cheap "anything new?" check.
    """

    def __init__(self, keep: int = 200) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._lock = threading.Lock()
        self._recent: deque[GameRecord] = deque(maxlen=keep)
        self._counts: dict[str, list[int]] = {}
        self._finished = 0

    @property
    def finished(self) -> int:
        """How many games finished since the server started."""
        return self._finished

    def add(self, record: GameRecord) -> None:
        with self._lock:
            self._recent.append(record)
            games_wins = self._counts.setdefault(record.player, [0, 0])
            games_wins[0] += 1
            games_wins[1] += int(record.won)
            self._finished += 1

    def recent(self, limit: int = 20, policy_only: bool = False) -> list[GameRecord]:
        """The latest finished games, newest first."""
        with self._lock:
            records = [r for r in reversed(self._recent) if r.is_policy or not policy_only]
        return records[:limit]

    def stats(self) -> list[PlayerStats]:
        """Per player label, humans first, then policies by weight version."""
        with self._lock:
            counts = {player: tuple(gw) for player, gw in self._counts.items()}
        return [PlayerStats(p, g, w) for p, (g, w) in sorted(counts.items(), key=lambda kv: _order(kv[0]))]


def _order(player: str) -> tuple[int, int, str]:
    if player == HUMAN:
        return (0, 0, player)
    version = weight_version_of(player)
    return (1, version, player) if version is not None else (2, 0, player)
