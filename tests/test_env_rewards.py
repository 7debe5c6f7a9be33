import itertools

import pytest

from env_space.rewards import DEFAULT_REWARDS, RewardConfig, format_reward, guess_reward, invalid_move_reward
from wire.wordle import MAX_GUESSES, decode, progress


def test_format_and_invalid_move_penalties() -> None:
    assert format_reward(found=True, tagged=True) == 0.0
    assert format_reward(found=True, tagged=False) == -0.05
    assert format_reward(found=False, tagged=False) == -0.2
    assert invalid_move_reward(found=False, tagged=False) == -0.2  # nothing parseable
    assert invalid_move_reward(found=True, tagged=True) == -0.1  # e.g. not in the word list
    assert invalid_move_reward(found=True, tagged=False) == pytest.approx(-0.15)


def test_guess_reward_pays_only_new_progress() -> None:
    assert guess_reward(decode("GYXXX"), 0.0, 5, tagged=True) == pytest.approx(0.15)
    assert guess_reward(decode("GYXXX"), 0.3, 4, tagged=True) == 0.0  # no better than before
    assert guess_reward(decode("XXXXX"), 0.3, 4, tagged=True) == 0.0  # never negative
    assert guess_reward(decode("GYXXX"), 0.0, 5, tagged=False) == pytest.approx(0.10)


def test_win_pays_more_for_fewer_guesses() -> None:
    assert guess_reward(decode("GGGGG"), 0.0, MAX_GUESSES - 1, tagged=True) == pytest.approx(2.0)
    assert guess_reward(decode("GGGGG"), 0.8, 0, tagged=True) == pytest.approx(1.1)


def _game_return(codes: list[str]) -> float:
    """Sum of the rewards of a game whose scored guesses have these feedback codes."""
    total, best = 0.0, 0.0
    for i, code in enumerate(codes):
        total += guess_reward(decode(code), best, MAX_GUESSES - i - 1, tagged=True)
        best = max(best, progress(decode(code)))
    return total


def test_returns_are_ordered_win_fast_over_win_slow_over_loss() -> None:
    feedback = ["XXXXX", "YXXXX", "GYXXX", "GGYYX", "GGGGX", "GGGYY"]
    wins = {k: _game_return(feedback[: k - 1] + ["GGGGG"]) for k in range(1, 7)}
    assert all(wins[k] > wins[k + 1] for k in range(1, 6))
    assert wins[1] == pytest.approx(2.0) and wins[6] == pytest.approx(1.5)
    # 4 greens (or 3 greens and 2 yellows) is the most a guess short of the word can score.
    best_loss = max(_game_return(list(p)) for p in itertools.product(["GGGGX", "GGGYY", "YYYYY"], repeat=6))
    assert best_loss == pytest.approx(0.4) and best_loss < wins[6]


def test_config_checks_signs() -> None:
    assert DEFAULT_REWARDS == RewardConfig()
    with pytest.raises(ValueError, match="penalties"):
        RewardConfig(invalid_word=0.5)
    with pytest.raises(ValueError, match="win must be > 0"):
        RewardConfig(win=0.0)


def test_an_own_word_earns_its_term_and_a_copied_one_does_not() -> None:
    config = RewardConfig(own_word=0.1)
    assert guess_reward(decode("GYXXX"), 0.0, 5, tagged=True, config=config, own=True) == pytest.approx(0.25)
    assert guess_reward(decode("GYXXX"), 0.0, 5, tagged=True, config=config) == pytest.approx(0.15)
    assert guess_reward(decode("GYXXX"), 0.0, 5, tagged=True, own=True) == pytest.approx(0.15)  # default: no term
    with pytest.raises(ValueError, match="own_word >= 0"):
        RewardConfig(own_word=-0.1)


def test_a_game_pays_the_own_word_term_for_words_no_message_showed() -> None:
    from env_space.game import WordleGame
    from env_space.words import load_word_lists

    game = WordleGame("tiger", load_word_lists(), episode_id="e", player="policy v1",
                      rewards=RewardConfig(own_word=0.1))
    copied = game.step("<guess>crane</guess>")  # the instructions' example
    own = game.step("<guess>mouse</guess>")
    assert copied.copied and copied.reward == pytest.approx(0.5 * 0.2)  # R, E yellow: progress only
    assert own.copied is False and own.reward == pytest.approx(0.1)  # no new progress, the own word's term


def test_five_letters_outside_the_list_get_part_of_the_penalty_back() -> None:
    config = RewardConfig(five_letters=0.05)
    assert invalid_move_reward(True, True, config, five_letters=True) == pytest.approx(-0.05)
    assert invalid_move_reward(True, True, config) == pytest.approx(-0.1)
    assert invalid_move_reward(False, False, config, five_letters=True) == pytest.approx(-0.2)  # nothing found
    assert invalid_move_reward(True, True, five_letters=True) == pytest.approx(-0.1)  # default: no term
    with pytest.raises(ValueError, match="five_letters must be between 0 and -invalid_word"):
        RewardConfig(five_letters=0.2)  # a non-word would earn
    with pytest.raises(ValueError, match="five_letters"):
        RewardConfig(five_letters=-0.01)


def test_a_game_gives_back_the_five_letter_term_for_the_shape_of_a_word_only() -> None:
    from env_space.game import WordleGame
    from env_space.words import load_word_lists

    game = WordleGame("tiger", load_word_lists(), episode_id="e", player="policy v1",
                      rewards=RewardConfig(five_letters=0.05))
    rewards = [game.step(f"<guess>{word}</guess>").reward for word in ("blue", "qzxvw", "coffee", "crane", "crane")]
    # 4 letters, 5 letters outside the list, 6 letters, a legal word, its repeat (in the list: no term)
    assert rewards == [pytest.approx(-0.1), pytest.approx(-0.05), pytest.approx(-0.1), pytest.approx(0.1),
                       pytest.approx(-0.1)]


def test_the_env_flag_refuses_a_five_letter_term_that_would_pay_a_non_word() -> None:
    import argparse

    from env_space.launch import add_arguments

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    assert parser.parse_args(["--five-letter-reward", "0.05"]).five_letter_reward == 0.05
    assert parser.parse_args([]).five_letter_reward == 0.0
    with pytest.raises(argparse.ArgumentError, match="must be from 0 to 0.1"):
        parser.parse_args(["--five-letter-reward", "0.5"])
