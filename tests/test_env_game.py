import re

import pytest

from env_space.errors import GameOverError, InvalidSecretError
from env_space.game import WordleGame
from env_space.prompt import INSTRUCTIONS
from env_space.rewards import DEFAULT_REWARDS
from env_space.words import load_word_lists


def new_game(secret: str = "crane", **kwargs: object) -> WordleGame:
    return WordleGame(secret, load_word_lists(), episode_id="e1", player="policy v3", **kwargs)


def test_first_observation_is_the_instructions_without_the_secret() -> None:
    obs = new_game().observe()
    assert obs.message == INSTRUCTIONS
    assert (obs.rows, obs.guesses_left, obs.secret, obs.reward, obs.done) == ([], 6, None, None, False)
    assert obs.last_move_valid is None and obs.player == "policy v3"


def test_win_reveals_the_secret_and_ends_the_game() -> None:
    game = new_game()
    first = game.step("<guess>slate</guess>")
    assert first.rows[0].model_dump() == {"word": "slate", "marks": "XXGXG"}
    assert first.message == (
        "SLATE ⬛⬛🟩⬛🟩 (S gray, L gray, A green, T gray, E green).\n"
        "You have 5 guesses left. Reply with your next guess inside <guess></guess>, for example <guess>filly</guess>."
    )
    assert first.reward == pytest.approx(0.2) and not first.done and first.secret is None
    last = game.step("<guess>CRANE</guess>")
    assert last.done and last.won and last.secret == "crane" and last.guesses_left == 4
    assert last.message.endswith("You won: the word was CRANE, found in 2 guesses.")
    assert last.reward == pytest.approx(0.3 + 1.0 + 0.4)
    assert last.total_reward == pytest.approx(first.reward + last.reward)
    with pytest.raises(GameOverError, match="game 'e1' is over"):
        game.step("crane")


def test_every_request_shows_a_new_example_word_never_the_secret_nor_a_word_played() -> None:
    def examples(game: WordleGame, moves: list[str]) -> list[str]:
        return [game.step(m).message.rsplit("<guess>", 1)[1].split("<", 1)[0] for m in moves]

    moves = ["<guess>slate</guess>", "junk", "<guess>fated</guess>", "<guess>pious</guess>"]
    game = new_game()
    assert game.observe().example == "crane"  # the instructions' example
    shown = examples(game, moves)
    assert game.observe().example == shown[-1]
    assert game.record().examples == ("crane", *shown[:-1])  # the example each move was shown before it
    assert len(set(shown)) == len(shown) and all(w in load_word_lists().answers for w in shown)
    assert examples(new_game(), moves) == shown  # same secret, same moves: same text (a GRPO group reads alike)
    assert examples(new_game("mound"), moves) != shown
    words = load_word_lists()
    for secret in words.answers[:200]:  # never the secret, never a word already on the board
        assert words.example(secret, 2, ["crane", "slate"]) not in {secret, "crane", "slate"}
    assert words.example("crane", 1, words.answers) in words.answers  # nothing left to exclude: any answer


def test_invalid_moves_do_not_use_a_guess_but_are_penalised() -> None:
    game = new_game()
    obs = game.step("<guess>xyzzy</guess>")
    assert (obs.guesses_left, obs.invalid_moves, obs.last_move_valid) == (6, 1, False)
    assert obs.error == "'xyzzy' is not in the word list" and obs.reward == -0.1
    assert obs.message.startswith("Invalid move: 'xyzzy' is not in the word list.")
    obs = game.step("I have no idea")
    assert obs.error is not None and obs.error.startswith("no guess found") and obs.reward == -0.2
    obs = game.step("<guess>cranes</guess>")
    assert obs.error == "'cranes' has 6 letters; a guess must have exactly 5"
    obs = game.step("slate")
    assert obs.last_move_valid and obs.error is None and obs.step_count == 4
    assert obs.reward == pytest.approx(0.2 - 0.05)  # untagged


def test_an_invalid_move_s_message_names_no_word_but_the_request_s_one_example() -> None:
    with_examples = new_game().step("I have no idea")
    assert re.findall(r"<guess>(\w+)</guess>", with_examples.message) == [with_examples.example]
    without = new_game(examples=0.0).step("I have no idea")  # an exam's game: no word at all
    assert "for example" not in without.message and without.example is None


def test_a_total_of_nothing_reads_0_never_minus_0() -> None:
    game = new_game()
    game.step("I have no idea")  # -0.2
    game.step("<guess>xyzzy</guess>")  # -0.1
    obs = game.step("<guess>brine</guess>")  # three greens: +0.3, and the floats sum to -2.8e-17
    assert (obs.reward, str(obs.total_reward), str(game.record().total_reward)) == (0.3, "0.0", "0.0")


WRONG = ("fjord", "pique", "bumpy", "whisk", "glyph", "vexed")  # six allowed words, none of them a secret here


def test_six_wrong_guesses_lose() -> None:
    game = new_game()
    for word in WRONG[:5]:
        assert not game.step(f"<guess>{word}</guess>").done
    obs = game.step(f"<guess>{WRONG[5]}</guess>")
    assert obs.done and not obs.won and obs.guesses_left == 0 and obs.secret == "crane"
    assert obs.message.endswith("Game over (no guesses left): the word was CRANE.")
    assert game.record().words == WRONG and not game.record().won


def test_a_word_already_guessed_is_an_invalid_move() -> None:
    game = new_game()
    first = game.step("<guess>fjord</guess>")
    again = game.step("<guess>FJORD</guess>")
    assert first.last_move_valid and not again.last_move_valid and again.error == "FJORD was already guessed"
    assert again.reward == pytest.approx(DEFAULT_REWARDS.invalid_word) and again.guesses_left == first.guesses_left
    assert again.message.startswith("Invalid move: FJORD was already guessed.")
    assert game.record().words == ("fjord",) and game.record().invalid_moves == 1


def test_too_many_invalid_moves_lose() -> None:
    game = new_game(max_invalid_moves=1)
    assert not game.step("??").done
    obs = game.step("??")
    assert obs.done and not obs.won and obs.invalid_moves == 2
    assert obs.message.endswith("Game over (too many invalid moves): the word was CRANE.")
    unlimited = new_game(max_invalid_moves=None)
    assert not any(unlimited.step("??").done for _ in range(50))


def test_record_says_who_played_and_how() -> None:
    game = new_game()
    game.step("xyzzy")
    game.step("<guess>crane</guess>")
    rec = game.record()
    assert (rec.player, rec.words, rec.marks, rec.won, rec.invalid_moves) == (
        "policy v3",
        ("crane",),
        ("GGGGG",),
        True,
        1,
    )
    assert rec.total_reward == game.observe().total_reward
    assert (rec.finished, rec.replies, rec.guesses) == (True, ("xyzzy", "<guess>crane</guess>"), ("", "crane"))
    assert rec.errors == ("'xyzzy' is not in the word list", "")


@pytest.mark.parametrize(("reply", "row", "error"), [
    ("<guess> The next guess is Hercubunk", None,
     "'the' has 3 letters; a guess must have exactly 5; the <guess> tag was left open, so its first word is the guess"),
    ("<guess>crane (no particular rules", "crane", None),
    ("<guess>slate</guess> and more", "slate", None),
    ("<guess>I pick slate</guess>", None, "'i' has 1 letter; a guess must have exactly 5"),
])
def test_the_env_scores_the_first_word_after_the_tag_and_nothing_else(reply: str, row: str | None,
                                                                      error: str | None) -> None:
    obs = new_game("fjord").step(reply)
    assert [r.word for r in obs.rows] == ([row] if row else []) and obs.error == error


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidSecretError, match="invalid secret: 'xyzzy' is not in the word list"):
        new_game("xyzzy")
    with pytest.raises(ValueError, match="max_invalid_moves must be >= 0"):
        new_game(max_invalid_moves=-1)
    assert new_game("CRANE").secret == "crane"
