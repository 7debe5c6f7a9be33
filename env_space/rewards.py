"""Rewards for one move, as pure functions (docs/spaces.md, "Rewards", documents the formula).

reward = format + validity + own + progress + win: `format` 0 inside <guess></guess>, ``untagged`` for a bare
one-word reply, ``no_guess`` for none; `validity` ``invalid_word`` for a guess not allowed or repeated (``five_letters``
back for five letters a-z); `own` ``own_word`` for a legal guess no message had shown; `progress` potential-based,
``progress_weight * max(0, p - best earlier p)`` with p = (greens + yellows / 2) / 5, so playing longer never earns
more; `win` ``win + speed * guesses left`` on the winning guess."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wire.wordle import Mark, is_win, progress


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms (defaults are the documented ones)."""

    win: float = 1.0
    """Reward for solving the puzzle."""
    speed: float = 0.1
    """Extra reward per guess left unused at a win."""
    progress_weight: float = 0.5
    """Scale of the shaped part from greens and yellows."""
    untagged: float = -0.05
    """A guess was found, but not inside <guess></guess>."""
    no_guess: float = -0.2
    """Nothing that looks like a guess."""
    invalid_word: float = -0.1
    """A guess with the wrong length, non-letters, not in the word list, or already guessed."""
    own_word: float = 0.0
    """A legal guess of the player's own: no message of the game had shown it (0: no such term)."""
    five_letters: float = 0.0
    """Given back on an invalid guess of five letters a-z that is not in the word list (never on a repeat): the
    right shape, a step from BLUE or COFFEE towards a word. At most ``-invalid_word``: a non-word never earns."""

    def __post_init__(self) -> None:
        if self.win <= 0 or self.speed < 0 or self.progress_weight < 0 or self.own_word < 0:
            raise ValueError("win must be > 0, speed, progress_weight and own_word >= 0")
        if max(self.untagged, self.no_guess, self.invalid_word) > 0:
            raise ValueError("untagged, no_guess and invalid_word are penalties: use values <= 0")
        if not 0 <= self.five_letters <= -self.invalid_word:
            raise ValueError(
                f"five_letters must be between 0 and -invalid_word ({-self.invalid_word:g}): a "
                f"non-word never earns, got {self.five_letters:g}"
            )


DEFAULT_REWARDS = RewardConfig()


def format_reward(found: bool, tagged: bool, config: RewardConfig = DEFAULT_REWARDS) -> float:
    """The format term: did the reply carry a guess, and inside the tags?"""
    if not found:
        return config.no_guess
    return 0.0 if tagged else config.untagged


def invalid_move_reward(
    found: bool, tagged: bool, config: RewardConfig = DEFAULT_REWARDS, five_letters: bool = False
) -> float:
    """Reward of a move that was not a legal guess (nothing found, or not an allowed word); `five_letters`: the
    guess was five letters a-z outside the word list (`RewardConfig.five_letters`)."""
    reward = format_reward(found, tagged, config)
    if found:
        reward += config.invalid_word + (config.five_letters if five_letters else 0.0)
    return reward


def guess_reward(
    marks: Sequence[Mark],
    best_progress_before: float,
    guesses_left: int,
    tagged: bool,
    config: RewardConfig = DEFAULT_REWARDS,
    own: bool = False,
) -> float:
    """Reward of a legal, scored guess.

    Args:
        marks: the feedback of this guess.
        best_progress_before: the best :func:`progress` of earlier guesses in the game (0 at first).
        guesses_left: guesses still unused after this one.
        tagged: whether the guess was inside <guess></guess>.
        own: whether no message of the game had shown the word before (`own_word`).
    """
    reward = format_reward(True, tagged, config) + (config.own_word if own else 0.0)
    reward += config.progress_weight * max(0.0, progress(marks) - best_progress_before)
    if is_win(marks):
        reward += config.win + config.speed * guesses_left
    return reward
