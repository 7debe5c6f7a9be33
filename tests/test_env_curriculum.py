"""Which messages of a game show their example: drawn from the secret and the move, so a group reads alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from env_space.curriculum import draw, shows_example
from env_space.game import WordleGame
from env_space.words import load_word_lists


def test_the_draw_is_fixed_per_secret_and_move_and_spread_over_the_unit_interval() -> None:
    assert draw("crane", 2) == draw("crane", 2) and draw("crane", 2) != draw("crane", 3)
    draws = [draw(w, m) for w in load_word_lists().answers[:200] for m in range(3)]
    assert all(0 <= d < 1 for d in draws)
    assert 0.4 < sum(d < 0.5 for d in draws) / len(draws) < 0.6


@given(st.sampled_from(load_word_lists().answers), st.integers(0, 12), st.floats(0, 1), st.floats(0, 1))
def test_fewer_examples_show_a_subset_of_the_messages(secret: str, move: int, low: float, high: float) -> None:
    low, high = sorted((low, high))
    assert not shows_example(secret, move, low) or shows_example(secret, move, high)
    assert shows_example(secret, move, 1.0) and not shows_example(secret, move, 0.0)


def test_games_of_one_secret_read_the_same_messages_at_the_same_probability() -> None:
    words = load_word_lists()

    def messages(episode: str) -> list[str]:
        game = WordleGame("tiger", words, episode_id=episode, player="policy v3", examples=0.5)
        shown = [game.observe().message]
        for word in ("slate", "xxxxx", "round", "piano"):
            shown.append(game.step(f"<guess>{word}</guess>").message)
        return shown

    a, b = messages("a"), messages("b")
    assert a == b
    assert any("for example" in m for m in a) and any("for example" not in m for m in a)
