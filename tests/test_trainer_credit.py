"""Per-move credit (`trainer_space.credit`): which tokens GRPO trains with which reward."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer_space import TrainerConfig
from trainer_space.credit import MoveChooser, one_move, reply_spans, whole_game
from trainer_space.rollouts import trajectory_columns
from wire.trajectory import Trajectory


def played(runs: list[tuple[int, int]], rewards: list[float], **fields: object) -> Trajectory:
    """A game whose completion alternates env tokens and replies: `runs` holds (env tokens, reply tokens) per move."""
    ids: list[int] = []
    mask: list[int] = []
    for env, reply in runs:
        mask += [0] * env + [1] * reply
    ids = list(range(100, 100 + len(mask)))
    logprobs = [-0.5 if m else 0.0 for m in mask]
    return Trajectory(prompt_ids=[1, 2], episode_id="e", completion_ids=ids, logprobs=logprobs, env_mask=mask,
                      turn_rewards=rewards, reward=sum(rewards), **fields)


def test_spans_are_the_runs_of_model_tokens() -> None:
    assert reply_spans([1, 1, 0, 0, 1, 0, 1, 1, 1]) == [(0, 2), (4, 5), (6, 9)]
    assert reply_spans([0, 0]) == [] and reply_spans([]) == []


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), min_size=1, max_size=6).map(
    lambda runs: [(max(env, 1) if i else env, reply) for i, (env, reply) in enumerate(runs)]), st.data())
def test_one_move_trains_exactly_that_reply_on_the_conversation_before_it(runs: list[tuple[int, int]],
                                                                          data: st.DataObject) -> None:
    rewards = [float(i) - 0.25 for i in range(len(runs))]
    game = played(runs, rewards)
    move = data.draw(st.integers(0, len(runs) - 1))
    sample = one_move(game, move)
    start, end = reply_spans(game.env_mask)[move]
    assert sample.completion_ids == game.completion_ids[:end]  # the conversation up to the end of the move
    assert sample.logprobs == game.logprobs[:end]
    assert sample.env_mask == [0] * start + [1] * (end - start)  # only this move's own tokens are trained
    assert sample.reward == rewards[move]


def test_one_move_refuses_what_it_cannot_split() -> None:
    game = played([(0, 2), (3, 2)], [0.1, -0.1])
    with pytest.raises(ValueError, match="no move 2"):
        one_move(game, 2)
    with pytest.raises(ValueError, match="cannot tell its moves apart"):
        one_move(played([(0, 2), (3, 2)], [0.1]), 0)
    assert whole_game(game).env_mask == game.env_mask and whole_game(game).reward == pytest.approx(0.0)


def test_each_group_is_trained_on_one_move_its_games_share() -> None:
    chooser = MoveChooser(group_size=2, seed=3)
    three = [(0, 2), (4, 1), (4, 3)]
    drawn = set()
    for _ in range(30):
        games = [played(three, [0.1, -0.1, 0.0]), played(three, [0.0, 0.0, -0.1]),   # group 1: three moves each
                 played(three, [0.1, -0.1, 0.0]), played(three[:1], [1.6])]           # group 2: one was won at once
        samples = chooser.samples(games)
        first = reply_spans(samples[0].env_mask)
        assert len(first) == 1 and first == reply_spans(samples[1].env_mask)  # one move, the same for the group
        drawn.add(first[0])
        assert samples[3].reward == 1.6 and samples[2].reward == 0.1  # group 2 shares only the first move
    assert drawn == set(reply_spans(played(three, [0, 0, 0]).env_mask))  # every move gets drawn


def test_a_move_every_game_played_alike_is_not_drawn() -> None:
    chooser = MoveChooser(group_size=2, seed=5)
    three = [(0, 2), (4, 1), (4, 3)]
    spans = reply_spans(played(three, [0, 0, 0]).env_mask)
    drawn = set()
    for _ in range(30):  # both open with the same word (same reward); they differ on moves 2 and 3 only
        samples = chooser.samples([played(three, [0.1, -0.1, 0.0]), played(three, [0.1, 0.0, -0.1])])
        drawn.add(reply_spans(samples[0].env_mask)[0])
    assert drawn == set(spans[1:])
    alike = chooser.samples([played(three, [0.1, -0.1, -0.1])] * 2)  # nothing differs: any move
    assert len(reply_spans(alike[0].env_mask)) == 1


def test_a_group_that_cannot_be_split_is_trained_on_whole_games() -> None:
    games = [played([(0, 2), (3, 2)], [0.1, -0.1]), played([(0, 2), (3, 2)], [0.1])]  # the second is malformed
    samples = MoveChooser(group_size=2, seed=0).samples(games)
    assert [s.reward for s in samples] == [g.reward for g in games]
    assert [s.env_mask for s in samples] == [g.env_mask for g in games]


def test_columns_train_a_move_and_log_the_game() -> None:
    games = [played([(0, 2), (3, 2)], [0.1, -0.1], guesses=["crane", ""]) for _ in range(2)]
    out = trajectory_columns(games, [False, True], MoveChooser(group_size=2, seed=1))
    assert out["env_reward"][0] in (0.1, -0.1) and out["env_reward"][1] is None  # a dropped game stays untrained
    assert out["game_reward"] == [pytest.approx(0.0)] * 2 and out["valid_share"] == [0.5, 0.5]
    whole = trajectory_columns(games, [False, False])
    assert whole["env_reward"] == [g.reward for g in games] and whole["env_mask"] == [g.env_mask for g in games]


def test_the_config_names_its_credit() -> None:
    assert TrainerConfig("b", None, "m").credit == "move"
    with pytest.raises(ValueError, match="credit must be one of game, move"):
        TrainerConfig("b", None, "m", credit="turn")  # type: ignore[arg-type]
