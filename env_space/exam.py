"""The env's side of the exam: the reference a player that only copies the env's examples sets.

The held-out secrets themselves are `WordLists.exam_secrets`; exam games are ordinary sessions started with
``exam`` and ``examples: false`` (`SessionStore.start`). A policy that learned only to copy the example word
of each message scores, on the same secrets and moves with the examples shown, what `copying_reference`
says: the line the exam's letters found must beat for the policy to be playing by itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from wire.env import ExamInfo, GameRecord
from wire.exam import ExamScores

from .game import WordleGame
from .words import WordLists, load_word_lists


def copying_games(words: WordLists, secrets: Sequence[str], moves: int) -> list[GameRecord]:
    """One game per secret of `moves` moves (fewer if it ends), every move the example word its message
    shows (examples on): CRANE from the instructions, then each request's own."""
    games = []
    for i, secret in enumerate(secrets):
        game = WordleGame(secret, words, episode_id=f"copying-{i}", player="copying")
        for _ in range(moves):
            observation = game.observe()
            if observation.done:
                break
            game.step(f"<guess>{observation.example}</guess>")
        games.append(game.record())
    return games


@functools.lru_cache(maxsize=64)
def copying_reference(games: int, turns: int) -> ExamInfo:
    """What copying the examples scores on the first `games` held-out secrets in `turns` moves (the shipped
    word lists; computed once per pair, in milliseconds).

    Raises:
        ValueError: `games` is not between 1 and the number of held-out secrets, or `turns` below 1.
    """
    words = load_word_lists()
    held_out = words.exam_secrets
    if not 1 <= games <= len(held_out) or turns < 1:
        raise ValueError(f"games must be 1 to {len(held_out)} and turns at least 1, got {games} and {turns}")
    scores = ExamScores.of(copying_games(words, held_out[:games], turns))
    return ExamInfo(held_out=len(held_out), games=games, turns=turns, copying=scores)
