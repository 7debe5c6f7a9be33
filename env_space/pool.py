"""One kind of live games with its own bounds: token holders' games, or anonymous visitors'.

Not thread-safe: :class:`~env_space.sessions.SessionStore` holds the lock around every call.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable

from .errors import ClientLimitError, ServerFullError
from .game import WordleGame


class SessionPool:
    """Live games by episode id, least recently used first, so expired games sit at the front.

    Args:
        capacity: Live games at most.
        idle_s: A game with no move for this long is dropped.
        per_client: Live games at most per client address; None: no per-client cap.
        clock: Monotonic seconds.
    """

    def __init__(self, capacity: int, idle_s: float, per_client: int | None, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.idle_s = idle_s
        self.per_client = per_client
        self._clock = clock
        self._games: OrderedDict[str, tuple[WordleGame, float, str | None]] = OrderedDict()
        self._clients: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._games)

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._games

    def admit(self, client: str | None) -> None:
        """Raise unless one more game (of ``client``) fits.

        Raises:
            ServerFullError: the pool is full. ClientLimitError: the client's cap is reached.
        """
        if len(self._games) >= self.capacity:
            _, last, _ = next(iter(self._games.values()))
            raise ServerFullError(len(self._games), self.capacity, self._wait(last))
        if self.per_client is not None and client is not None and self._clients[client] >= self.per_client:
            last = min(t for _, t, c in self._games.values() if c == client)
            raise ClientLimitError(self._clients[client], self.per_client, self._wait(last))

    def add(self, episode_id: str, game: WordleGame, client: str | None) -> None:
        """Hold a new game (call :meth:`admit` first)."""
        self._games[episode_id] = (game, self._clock(), client)
        if client is not None:
            self._clients[client] += 1

    def get(self, episode_id: str) -> WordleGame | None:
        entry = self._games.get(episode_id)
        return entry[0] if entry else None

    def touch(self, episode_id: str) -> None:
        """A move was made: the game's idle time starts again."""
        game, _, client = self._games.pop(episode_id)
        self._games[episode_id] = (game, self._clock(), client)

    def pop(self, episode_id: str) -> WordleGame | None:
        """Remove a game; None if it is not here."""
        entry = self._games.pop(episode_id, None)
        if entry is None:
            return None
        self._release(entry[2])
        return entry[0]

    def sweep(self) -> None:
        """Drop the games idle for longer than ``idle_s``."""
        deadline = self._clock() - self.idle_s
        while self._games:
            _, (_, last, client) = next(iter(self._games.items()))
            if last > deadline:
                break
            self._games.popitem(last=False)
            self._release(client)

    def _release(self, client: str | None) -> None:
        if client is not None:
            self._clients[client] -= 1
            if self._clients[client] <= 0:
                del self._clients[client]

    def _wait(self, last_move: float) -> int:
        """Whole seconds until a game last moved at ``last_move`` expires (at least 1)."""
        return max(1, math.ceil(last_move + self.idle_s - self._clock()))
