"""Wordle as TRL's GRPOTrainer sees it: a dataset of prompts naming game seeds, and reward functions.

The rollout Space builds the real chat prompt and plays the whole game; the trainer's dataset only
says *which* game. A row's prompt is the string ``wordle-seed:<n>``: TRL hands `rollout_func` the
prompts (already repeated `num_generations` times in a row), and the seed is read back from them, so
the games of one GRPO group are played on the same secret word.

Rewards come from the env Space (through the rollout's trajectories, as extra fields): `env_reward`
is what GRPO optimises (a move's reward or a game's, `credit.py`); `won`, `valid_guesses`, `letters` and
`game_reward` have weight 0, so TRL logs the win rate, the share of moves the env accepted as valid
guesses, the letters found (greens + yellows / 2 of the best guess) and the game's total reward beside
it, per step, without training on them.
"""

from __future__ import annotations

import random
from typing import Any

PROMPT_PREFIX = "wordle-seed:"


def seed_prompt(seed: int) -> str:
    """The dataset prompt that names the game with `seed`."""
    return f"{PROMPT_PREFIX}{seed}"


def prompt_seed(prompt: Any) -> int:
    """The seed named by a dataset prompt (see `seed_prompt`).

    Raises:
        ValueError: the prompt is not one of ours (a dataset from elsewhere was passed to the trainer).
    """
    if not isinstance(prompt, str) or not prompt.startswith(PROMPT_PREFIX):
        raise ValueError(f"prompt {prompt!r} does not name a Wordle game; rows must be {PROMPT_PREFIX}<seed>")
    return int(prompt[len(PROMPT_PREFIX) :])


def seed_dataset(rows: int, seed: int = 0) -> Any:
    """A `datasets.Dataset` of `rows` distinct game seeds in a random order drawn from `seed`.

    Seeds are drawn from a large range, so a resumed session (another `seed`) meets new words.
    """
    from datasets import Dataset

    rng = random.Random(seed)
    seeds = rng.sample(range(2**31 - 1), rows)
    return Dataset.from_dict({"prompt": [seed_prompt(s) for s in seeds]})


def env_reward(completions: list, env_reward: list[float | None], **_: Any) -> list[float | None]:
    """What GRPO optimises: the env's reward of the trained move, or of the whole game (`credit.py`); None for a
    dropped (too stale) game, which TRL leaves out."""
    return list(env_reward)


def game_reward(
    completions: list, game_reward: list[float], env_reward: list[float | None], **_: Any
) -> list[float | None]:
    """The env's total reward per game (weight 0: logged; with per-move credit `env_reward` is one move's)."""
    return [None if r is None else float(g) for g, r in zip(game_reward, env_reward, strict=True)]


def won(completions: list, won: list[bool], env_reward: list[float | None], **_: Any) -> list[float | None]:
    """1.0 for a won game, 0.0 for a lost one (weight 0: logged as the win rate, not trained on)."""
    return [None if r is None else float(w) for w, r in zip(won, env_reward, strict=True)]


def valid_guesses(
    completions: list, valid_share: list[float], env_reward: list[float | None], **_: Any
) -> list[float | None]:
    """The share of a game's moves the env scored as valid guesses (weight 0: logged, not trained on)."""
    return [None if r is None else float(v) for v, r in zip(valid_share, env_reward, strict=True)]


def letters(completions: list, letters: list[float], env_reward: list[float | None], **_: Any) -> list[float | None]:
    """Letters the game found (`wire.wordle.letters_found`; weight 0: logged, not trained on)."""
    return [None if r is None else float(n) for n, r in zip(letters, env_reward, strict=True)]


#: Reward functions and their weights in `GRPOConfig.reward_weights`.
REWARD_FUNCS = (env_reward, won, valid_guesses, letters, game_reward)
REWARD_WEIGHTS = (1.0, 0.0, 0.0, 0.0, 0.0)
