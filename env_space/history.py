"""Who played which game: finished games for the UI feed, and win rates per player and kind of game."""

from __future__ import annotations

import threading
from collections import deque

from wire.env import HUMAN, GameKind, GameRecord, PlayerStats, weight_version_of


class GameHistory:
    """Thread-safe log of finished games: the latest ``keep`` in full, counts for all of them by player and kind of
    game (`GameKind`: a training game cut after 3 moves and a showcase game played whole are never one count).

    ``finished`` only grows; a UI polls it as a cheap "anything new?" check.
    """

    def __init__(self, keep: int = 200) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._lock = threading.Lock()
        self._recent: deque[GameRecord] = deque(maxlen=keep)
        self._counts: dict[tuple[str, GameKind], list[int]] = {}
        self._finished = 0

    @property
    def finished(self) -> int:
        """How many games finished since the server started."""
        return self._finished

    def add(self, record: GameRecord) -> None:
        with self._lock:
            self._recent.append(record)
            games_wins = self._counts.setdefault((record.player, record.kind), [0, 0])
            games_wins[0] += 1
            games_wins[1] += int(record.won)
            self._finished += 1

    def recent(self, limit: int = 20, policy_only: bool = False, kind: GameKind | None = None) -> list[GameRecord]:
        """The latest finished games, newest first: the policy's only if asked, of one kind only if asked."""
        with self._lock:
            records = [
                r
                for r in reversed(self._recent)
                if (r.is_policy or not policy_only) and (kind is None or r.kind == kind)
            ]
        return records[:limit]

    def stats(self) -> list[PlayerStats]:
        """Per player label and kind of game, humans first, then policies by weight version, kinds in `GameKind`'s
        order."""
        with self._lock:
            counts = {key: tuple(gw) for key, gw in self._counts.items()}
        return [
            PlayerStats(player=p, kind=k, games=g, wins=w)
            for (p, k), (g, w) in sorted(counts.items(), key=lambda kv: _order(*kv[0]))
        ]


_KIND_ORDER = {kind: n for n, kind in enumerate(GameKind)}


def _order(player: str, kind: GameKind) -> tuple[int, int, str, int]:
    if player == HUMAN:
        return (0, 0, player, _KIND_ORDER[kind])
    version = weight_version_of(player)
    return (1, version, player, _KIND_ORDER[kind]) if version is not None else (2, 0, player, _KIND_ORDER[kind])
