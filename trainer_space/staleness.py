"""The staleness bound: how many versions behind the trainer a game's weights may be.

Rollouts run on their own schedule: a rollout server applies each published version when it has
fetched it, so a game may have been played (partly) by weights several optimizer steps old. A game
is judged on the OLDEST version it used (`Trajectory.version`). What `rollout_func` does with the
stale ones is in `rollouts.py`; this module only decides and counts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rollout_space.messages import Trajectory


def staleness(trajectory: Trajectory, current_version: int) -> int:
    """Versions between the trainer's current weights and the oldest weights that played the game."""
    return current_version - trajectory.version


def stale_indices(trajectories: list[Trajectory], current_version: int, max_staleness: int) -> list[int]:
    """Positions of the games more than `max_staleness` versions behind `current_version`."""
    return [i for i, t in enumerate(trajectories) if staleness(t, current_version) > max_staleness]


@dataclass
class StalenessCounts:
    """Running totals, for the status and the UI. Safe to read from other threads (ints, one writer).

    Attributes:
        games: Games accepted into a training step.
        replayed: Stale games played again (each replay counted once).
        dropped: Games still stale after the replays: kept out of the gradient.
        max_seen: Largest staleness of an accepted game.
    """

    games: int = 0
    replayed: int = 0
    dropped: int = 0
    max_seen: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, *, games: int = 0, replayed: int = 0, dropped: int = 0, seen: int = 0) -> None:
        with self._lock:
            self.games += games
            self.replayed += replayed
            self.dropped += dropped
            self.max_seen = max(self.max_seen, seen)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {"games": self.games, "replayed": self.replayed, "dropped": self.dropped, "max_seen": self.max_seen}
