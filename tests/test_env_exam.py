"""The env's exam: held-out secrets no training game meets, exam sessions without examples, and the
reference a player that only copies the examples sets."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_space.errors import InvalidSecretError
from env_space.exam import copying_games, copying_reference
from env_space.history import GameHistory
from env_space.sessions import SessionStore
from env_space.words import load_word_lists
from wire.exam import HELD_OUT_SECRETS

WORDS = load_word_lists()
HELD_OUT = set(WORDS.exam_secrets)


def test_a_fixed_set_of_answers_is_held_out() -> None:
    assert len(WORDS.exam_secrets) == HELD_OUT_SECRETS == len(HELD_OUT)
    assert HELD_OUT <= set(WORDS.answers) and HELD_OUT.isdisjoint(WORDS.training_answers)
    assert len(WORDS.training_answers) == len(WORDS.answers) - HELD_OUT_SECRETS
    assert load_word_lists.__wrapped__().exam_secrets == WORDS.exam_secrets  # the same words in every process


@settings(max_examples=2000)
@given(st.integers(0, 2**63 - 1))
def test_no_seed_ever_draws_a_held_out_secret(seed: int) -> None:
    assert WORDS.pick_secret(seed) not in HELD_OUT


def test_no_random_game_and_no_example_ever_shows_a_held_out_secret() -> None:
    assert not HELD_OUT & {WORDS.pick_secret() for _ in range(3000)}
    store = SessionStore(WORDS, GameHistory())
    for seed in range(300):
        observation = store.start(player="policy v1", seed=seed)
        examples = {observation.example}
        for word in ("slate", "round", "piano", "xxxxx", "lucky"):
            observation = store.step(observation.episode_id, f"<guess>{word}</guess>")
            examples.add(observation.example)
            if observation.done:
                break
        assert not HELD_OUT & examples, f"seed {seed} showed a held-out word as its example"


def test_an_exam_session_plays_its_held_out_secret_without_a_word_to_copy() -> None:
    store = SessionStore(WORDS, GameHistory())
    observation = store.start(player="policy v4", exam=3, examples=0.0)
    assert observation.example is None and "for example" not in observation.message
    for word in ("guess", "slate", "zzzzz", "round", "piano", "lucky", "mango", "tiger"):
        observation = store.step(observation.episode_id, f"<guess>{word}</guess>")
        assert observation.example is None and "for example" not in observation.message
        if observation.done:
            break
    [record] = store.history.recent(1)
    assert record.exam and record.secret == WORDS.exam_secrets[3] and record.player == "policy v4"
    assert record.copied[:2] == (True, False)  # GUESS is a word of the instructions; SLATE the player's own
    with pytest.raises(InvalidSecretError, match="held-out secrets by its number"):
        store.start(player="policy v4", exam=HELD_OUT_SECRETS)
    with pytest.raises(InvalidSecretError, match="and no secret"):
        store.start(player="policy v4", exam=0, secret="crane")


def test_a_word_the_game_showed_is_copied_and_one_it_did_not_is_the_players_own() -> None:
    store = SessionStore(WORDS, GameHistory())
    observation = store.start(player="policy v1", seed=11)  # examples on: CRANE is the instructions' example
    first = store.step(observation.episode_id, "<guess>crane</guess>")
    example = first.example
    second = store.step(observation.episode_id, f"<guess>{example}</guess>")
    third = store.step(observation.episode_id, "<guess>green</guess>")  # a colour name of the feedback
    own = store.step(observation.episode_id, "<guess>mouse</guess>")
    assert [first.copied, second.copied, third.copied] == [True, True, True]
    assert own.rows[-1].word == "mouse" and own.copied is False
    invalid = store.step(observation.episode_id, "<guess>qqqqq</guess>")
    assert invalid.copied is None


def test_copying_the_examples_scores_the_reference_line() -> None:
    info = copying_reference(16, 3)
    assert (info.held_out, info.games, info.turns) == (HELD_OUT_SECRETS, 16, 3)
    scores = info.copying
    assert scores.valid_rate == 1.0 and scores.own == 0 and scores.own_rate == 0.0 and scores.scored == 48
    assert scores.words[0] == "crane" and 1.0 < scores.letters < 2.5
    games = copying_games(WORDS, WORDS.exam_secrets[:2], 3)
    assert [g.guesses[0] for g in games] == ["crane", "crane"] and all(all(g.copied) for g in games)
    with pytest.raises(ValueError, match="games must be 1 to 64"):
        copying_reference(65, 3)


def test_the_instructions_name_no_word_without_examples() -> None:
    store = SessionStore(WORDS, GameHistory())
    text = store.start(player="human", seed=1, examples=0.0).message
    assert "<guess></guess> tags." in text and not re.search(r"<guess>\w+</guess>", text)
