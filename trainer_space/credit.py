"""Which tokens of a game GRPO credits with which reward: the whole game with its total, or one move with its own.

A game is one TRL sample (TRL's `rollout_func` returns one completion per prompt), and GRPO gives every
trained token of a sample the same advantage. With the game's total reward, a valid first move lifts the
game's later moves too, invalid ones included: SmolLM2 copies the instructions' example word (CRANE) on
its first move, that game beats its group, and the CRANE it repeated on later moves (invalid) is
reinforced with it, until every move of every game is CRANE and the group's games no longer differ.

Per-move credit (`TrainerConfig.credit = "move"`) trains each GRPO group on one of its moves, drawn per
group among the moves where its games' rewards differ (`MoveChooser`): every game of the group keeps its
conversation up to the end of that move, only that move's tokens are trained (`env_mask`), and its reward
is the env's reward for that move. A valid later move is
then credited against the group's later moves alone, and a repeat against other invalid moves. The games
are played whole either way, and the curves (valid-guess rate, letters, wins) are of the whole games.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from wire.trajectory import Trajectory

if TYPE_CHECKING:
    from .config import TrainerConfig

logger = logging.getLogger(__name__)

Credit = Literal["game", "move"]
CREDITS: tuple[Credit, ...] = ("game", "move")


@dataclass(frozen=True)
class Sample:
    """The completion columns of one TRL sample and the reward GRPO trains it on."""

    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float


def reply_spans(env_mask: Sequence[int]) -> list[tuple[int, int]]:
    """`(start, end)` of each run of the model's own tokens (env_mask 1): one per reply, in order."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate([*env_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def whole_game(game: Trajectory) -> Sample:
    """The game as played, credited with its total reward (its own lists: nothing is copied)."""
    return Sample(game.completion_ids, game.logprobs, game.env_mask, game.reward)


def one_move(game: Trajectory, move: int) -> Sample:
    """The game up to the end of reply `move` (0-based), only that reply's tokens trained, with its reward.

    Raises:
        ValueError: the game has no such reply, or its tokens do not split into one run per reply.
    """
    spans = reply_spans(game.env_mask)
    if len(spans) != len(game.turn_rewards):
        raise ValueError(
            f"game {game.episode_id}: {len(spans)} runs of model tokens for {len(game.turn_rewards)} "
            "replies; cannot tell its moves apart"
        )
    if not 0 <= move < len(spans):
        raise ValueError(f"game {game.episode_id} has {len(spans)} replies, no move {move}")
    start, end = spans[move]
    mask = [0] * start + [1] * (end - start)
    return Sample(list(game.completion_ids[:end]), list(game.logprobs[:end]), mask, game.turn_rewards[move])


class MoveChooser:
    """Draws the move each GRPO group is trained on, among the moves every game of the group made (a group
    whose games were cut or won early draws among the moves they share): uniformly among those whose
    rewards differ within the group, since a move the games all played alike has no advantage to train
    on; uniformly among all when none differ. So once every game opens with the same word, the first
    move is no longer drawn, and the later moves, where the games differ, are."""

    def __init__(self, group_size: int, seed: int) -> None:
        self.group_size = group_size
        self._rng = random.Random(seed)

    def samples(self, games: Sequence[Trajectory]) -> list[Sample]:
        """One sample per game; consecutive runs of `group_size` games are the groups (TRL's order)."""
        out: list[Sample] = []
        for at in range(0, len(games), self.group_size):
            group = games[at : at + self.group_size]
            shared = range(min(len(g.turn_rewards) for g in group))
            differ = [k for k in shared if len({round(g.turn_rewards[k], 6) for g in group}) > 1]
            move = self._rng.choice(differ or shared) if shared else None
            try:
                out += [whole_game(g) if move is None else one_move(g, move) for g in group]
            except ValueError as e:
                logger.warning("%s: the group is trained on whole games instead", e)
                out += [whole_game(g) for g in group]
        return out


def move_chooser(config: TrainerConfig) -> MoveChooser | None:
    """The chooser `config.credit` asks for: None for whole-game credit."""
    return MoveChooser(config.num_generations, config.seed) if config.credit == "move" else None
