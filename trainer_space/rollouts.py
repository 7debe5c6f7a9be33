"""TRL's `rollout_func`: play the step's games on the rollout Space and hand GRPO their tokens.

Each trajectory from the rollout Space is a whole multi-turn game: the model's turns and the env's
feedback concatenated in `completion_ids`, with `env_mask` marking the model's tokens (TRL trains on
those only) and the env's reward. Games too stale (`TrainerConfig.max_staleness`) are handled so:

1. they are played again on the same seed (the rollout has usually caught up by then), up to
   `stale_retries` rounds, `stale_wait` seconds apart; each replay is counted;
2. games still stale after that are *dropped*: counted, and returned with reward None. TRL then
   leaves them out of the group's mean and std and gives them zero advantage, so they add no gradient.
   The row stays (TRL needs one completion per prompt), and the group's other games still count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from delta.storage import RetryPolicy
from wire.errors import RolloutError, RolloutRefusedError
from wire.trajectory import Trajectory
from wire.wordle import letters_found

from .config import TrainerConfig
from .credit import MoveChooser, move_chooser, whole_game
from .staleness import (
    VERSIONS_COLUMN,
    StalenessCounts,
    StepRollouts,
    examples_scheduled,
    examples_shown,
    stale_indices,
    staleness,
    straddled,
)
from .task import prompt_seed

logger = logging.getLogger(__name__)


class RolloutsStopped(RuntimeError):
    """The session was stopped while waiting to retry a failed rollout request: the run ends cleanly."""


class RolloutSource(Protocol):
    """What the rollout function needs of the rollout Space: `trainer_space.rollout_client.RolloutClient`'s `rollout`
    (tests and benchmarks pass stand-ins). Raises `wire.errors.RolloutError` when a request fails."""

    def rollout(self, games: Sequence[dict[str, Any]], **sampling: Any) -> list[Trajectory]: ...


class WordleRollouts:
    """A `rollout_func(prompts, trainer) -> dict` for GRPOTrainer, backed by a rollout Space.

    Args:
        config: Sampling, staleness and turn settings.
        client: Plays the games: a `trainer_space.rollout_client.RolloutClient` or a stand-in.
        current_version: Returns the trainer's current weight version (what staleness is measured from).
        stop: Set when the session stops: ends the wait between retries.

    Attributes:
        counts: Staleness totals.
        recent: The latest games accepted (newest last), for the UI.
        last_error: The last failed rollout request, with its time (kept after recovery, for the UI).
        failing: Failed requests in a row right now (0 once a request succeeds).
        last_step: What the last step's games took (the wait for them, their staleness).
    """

    def __init__(
        self,
        config: TrainerConfig,
        client: RolloutSource,
        current_version: Callable[[], int],
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.current_version = current_version
        self.counts = StalenessCounts()
        self.recent: deque[Trajectory] = deque(maxlen=20)
        self.last_error: str | None = None
        self.failing = 0
        self.last_step = StepRollouts()
        self._stop = stop or threading.Event()
        self.moves = move_chooser(config)
        self._played_with: dict[str, float] = {}  # the example probability each game of the step was sent with

    def play(self, seeds: list[int]) -> list[Trajectory]:
        """Play one game per seed on the rollout Space (same seed: same word), retrying with backoff while
        the rollout (or its env) fails.

        Raises:
            RolloutsStopped: the session stopped while waiting to retry.
            RolloutRefusedError: the rollout refused the request itself (a wrong token, a request over its
                caps): no retry, since the same request would be refused again.
        """
        c = self.config
        policy = RetryPolicy(None, c.retry_wait, c.retry_max_wait)
        while True:
            probability = c.schedule.probability(self.current_version())
            try:
                games = self.client.rollout(
                    games=[{"seed": s} for s in seeds],
                    max_tokens=c.max_tokens,
                    temperature=c.temperature,
                    max_turns=c.max_turns,
                    reply_prefix=c.reply_prefix,
                    examples=probability,
                )
            except RolloutError as e:
                self.failing += 1
                self.last_error = f"{time.strftime('%H:%M:%S')} {e}"
                if isinstance(e, RolloutRefusedError):
                    raise
                wait = policy.delay(self.failing)
                logger.warning("rollout request failed (%d in a row), retrying in %.1f s: %s", self.failing, wait, e)
                if self._stop.wait(wait):
                    raise RolloutsStopped("stopped while waiting to retry the rollout") from e
                continue
            self.failing = 0
            self._played_with.update((g.episode_id, probability) for g in games)
            return games

    def collect(self, seeds: list[int]) -> tuple[list[Trajectory], list[bool]]:
        """Games for `seeds`, replaying stale ones; returns them and, per game, whether it was dropped."""
        c = self.config
        start = time.monotonic()
        self._played_with = {}
        games = self.play(seeds)
        stale = stale_indices(games, self.current_version(), c.max_staleness)
        for _ in range(c.stale_retries):
            if not stale:
                break
            time.sleep(c.stale_wait)
            self.counts.add(replayed=len(stale))
            for i, game in zip(stale, self.play([seeds[i] for i in stale]), strict=True):
                games[i] = game
            stale = stale_indices(games, self.current_version(), c.max_staleness)
        if stale:
            logger.warning(
                "%d of %d games still more than %d versions stale after %d replays: dropped",
                len(stale),
                len(games),
                c.max_staleness,
                c.stale_retries,
            )
        dropped = [i in set(stale) for i in range(len(games))]
        now = self.current_version()
        kept = [g for g, d in zip(games, dropped, strict=True) if not d]
        self.counts.add(games=len(kept), dropped=len(stale), seen=max((staleness(g, now) for g in kept), default=0))
        self.recent.extend(kept)
        hist = Counter(staleness(g, now) for g in kept)
        straddles, reported = straddled(kept)
        self.last_step = StepRollouts(
            waited_s=time.monotonic() - start,
            staleness=dict(hist),
            dropped=len(stale),
            examples_shown=examples_shown(kept),
            straddled=straddles,
            versions_reported=reported,
            examples_scheduled=examples_scheduled(kept, lambda g: self._played_with[g.episode_id]),
        )
        return games, dropped

    def __call__(self, prompts: list, trainer: Any = None) -> dict[str, list]:
        """TRL's `rollout_func` output, a dict of columns (see `trajectory_columns`)."""
        games, dropped = self.collect([prompt_seed(p) for p in prompts])
        return trajectory_columns(games, dropped, self.moves)


def trajectory_columns(
    games: list[Trajectory], dropped: list[bool], moves: MoveChooser | None = None
) -> dict[str, list]:
    """TRL's `rollout_func` output for `games`, a dict of columns: the one place trajectories become plain
    lists. A dropped game keeps its row (TRL needs one per prompt) with reward None: no gradient.

    With `moves`, each group is trained on one move (`credit.py`): `env_reward` is that move's reward and
    `game_reward` the game's total (logged); without, both are the game's total. `token_versions` holds each
    completion token's weight version (`Trajectory.token_versions`, cut to the sample: a move's sample is the game's
    completion up to that move), which the off-policy correction bounds token by token."""
    samples = moves.samples(games) if moves is not None else [whole_game(g) for g in games]
    return {
        "prompt_ids": [g.prompt_ids for g in games],
        "completion_ids": [s.completion_ids for s in samples],
        "logprobs": [s.logprobs for s in samples],
        "env_mask": [s.env_mask for s in samples],
        "env_reward": [None if d else s.reward for s, d in zip(samples, dropped, strict=True)],
        "game_reward": [g.reward for g in games],
        "won": [g.won for g in games],
        "valid_share": [valid_share(g) for g in games],
        "letters": [letters_found(g.marks) for g in games],
        "rollout_version": [g.version for g in games],
        VERSIONS_COLUMN: [g.token_versions()[: len(s.completion_ids)] for g, s in zip(games, samples, strict=True)],
    }


def valid_share(game: Trajectory) -> float:
    """The share of a game's moves the env scored as valid guesses (its `guesses` hold "" for the others)."""
    moves = game.guesses
    return sum(1 for g in moves if g) / len(moves) if moves else 0.0
