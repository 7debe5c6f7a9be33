"""The staleness bound: how many versions behind the trainer a game's weights may be.

Rollouts run on their own schedule: a rollout server applies each published version when it has
fetched it, so a game may have been played (partly) by weights several optimizer steps old. A game
is judged on the OLDEST version it used (`Trajectory.version`). What `rollout_func` does with the
stale ones is in `rollouts.py`; this module only decides and counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from wire.trainer import Staleness
from wire.trajectory import Trajectory

#: The rollout function's column with each completion token's weight version (-1: none, the env's tokens), which the
#: off-policy correction bounds token by token (`offpolicy.OffPolicyGRPOTrainer`).
VERSIONS_COLUMN = "token_versions"


def straddled(games: list[Trajectory]) -> tuple[int, bool | None]:
    """Replies of `games` whose tokens were sampled by more than one weight version, and whether the engines reported
    each token's version (None: no game)."""
    return sum(g.straddled for g in games), (all(g.versions_reported for g in games) if games else None)


def examples_shown(games: list[Trajectory]) -> float | None:
    """Share of the games' replies whose message showed the env's example guess (None: no reply): how much of the
    training valid-guess rate can be a copied example."""
    shown = [bool(e) for g in games for e in g.examples]
    return sum(shown) / len(shown) if shown else None


def examples_scheduled(games: list[Trajectory], probability: Callable[[Trajectory], float]) -> float | None:
    """What the run's schedule gave the games' messages: the mean, over their replies, of the probability each game
    was played with (`probability`; None: no reply). `examples_shown` of the same games is a draw around it."""
    given = [probability(g) for g in games for _ in g.examples]
    return sum(given) / len(given) if given else None


def staleness(trajectory: Trajectory, current_version: int) -> int:
    """Versions between the trainer's current weights and the oldest weights that played the game."""
    return current_version - trajectory.version


def stale_indices(trajectories: list[Trajectory], current_version: int, max_staleness: int) -> list[int]:
    """Positions of the games more than `max_staleness` versions behind `current_version`."""
    return [i for i, t in enumerate(trajectories) if staleness(t, current_version) > max_staleness]


class StalenessCounts:
    """Running totals, for the status and the UI. Thread-safe: `totals` is a frozen snapshot, replaced whole
    on each `add`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = Staleness()

    def add(self, *, games: int = 0, replayed: int = 0, dropped: int = 0, seen: int = 0, refused: int = 0) -> None:
        with self._lock:
            t = self._totals
            self._totals = Staleness(
                games=t.games + games,
                replayed=t.replayed + replayed,
                dropped=t.dropped + dropped,
                max_seen=max(t.max_seen, seen),
                refused=t.refused + refused,
            )

    def totals(self) -> Staleness:
        """The totals so far (a consistent snapshot)."""
        return self._totals


@dataclass
class StepRollouts:
    """What the last step's rollout function took, for its `StepRecord`: how long it waited for games,
    how stale they were (versions behind -> games), how many it dropped, and (fleet) which groups."""

    waited_s: float = 0.0
    groups: list[str] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)
    dropped: int = 0
    refused: int = 0
    examples_shown: float | None = None
    """Share of the replies of the games trained on whose message showed the env's example guess (`examples_shown`)."""
    straddled: int = 0
    """Replies of the games trained on whose tokens were sampled by more than one weight version (`straddled`)."""
    versions_reported: bool | None = None
    """Whether the engines reported each token's weight version (else per reply); None: no game."""
    examples_scheduled: float | None = None
    """What the run's schedule gave those replies' messages (`examples_scheduled`)."""
