"""The staleness bound and `rollout_func`'s output, against a real rollout server (tiny model, empty bucket)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._env_server import running_server
from tests._trainer_stack import tiny_model
from trainer_space import TrainerConfig
from trainer_space.credit import reply_spans
from trainer_space.rollout_client import RolloutClient
from trainer_space.rollouts import WordleRollouts, valid_share
from trainer_space.staleness import StalenessCounts, stale_indices, staleness
from trainer_space.task import REWARD_FUNCS, REWARD_WEIGHTS, prompt_seed, seed_prompt, valid_guesses
from wire.rollout import Trajectory
from wire.wordle import letters_found


def game(**fields: object) -> Trajectory:
    return Trajectory(prompt_ids=[1], episode_id="e", **fields)


def test_staleness_is_judged_on_the_oldest_version() -> None:
    games = [game(versions=[7, 9]), game(versions=[9]), game(versions=[10, 10])]
    assert [staleness(g, 10) for g in games] == [3, 1, 0]
    assert stale_indices(games, 10, max_staleness=1) == [0]
    assert stale_indices(games, 10, max_staleness=0) == [0, 1]
    assert stale_indices(games, 10, max_staleness=3) == []
    counts = StalenessCounts()
    counts.add(games=2, dropped=1, seen=1)
    counts.add(replayed=3, seen=0)
    assert counts.totals().model_dump() == {"games": 2, "replayed": 3, "dropped": 1, "max_seen": 1, "refused": 0}


def test_valid_guesses_is_a_logged_share_of_env_accepted_moves() -> None:
    assert valid_share(game(guesses=["", "crane", "", "slate"])) == 0.5 and valid_share(game()) == 0.0
    assert valid_guesses([None] * 3, valid_share=[0.5, 1.0, 0.0], env_reward=[0.2, None, -1.0]) == [0.5, None, 0.0]
    assert dict(zip([f.__name__ for f in REWARD_FUNCS], REWARD_WEIGHTS)) == {
        "env_reward": 1.0, "won": 0.0, "valid_guesses": 0.0, "letters": 0.0, "game_reward": 0.0}  # only the env's reward is trained on


def test_prompts_name_seeds() -> None:
    assert prompt_seed(seed_prompt(123)) == 123
    with pytest.raises(ValueError, match="does not name a Wordle game"):
        prompt_seed("What is the capital of France?")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutClient]:
    root = tmp_path_factory.mktemp("rollouts")
    with running_server("env") as env, running_server("rollout", "--bucket", str(root / "bucket"), "--model",
                                             tiny_model(str(root / "model")), "--env-url", env, "--engine",
                                             "transformers", "--showcase-every", "0") as url, RolloutClient(url) as c:
        yield c


def rollouts(client: RolloutClient, current: int, max_staleness: int, **settings: object) -> WordleRollouts:
    config = TrainerConfig("unused", client.url, "unused", **{
        "max_tokens": 2, "max_turns": 1, "max_staleness": max_staleness, "stale_retries": 1, "stale_wait": 0.0,
        "games_per_step": 4, "num_generations": 2, **settings})
    return WordleRollouts(config, client, lambda: current)


def test_fresh_games_become_trl_rows_grouped_by_seed(client: RolloutClient) -> None:
    served = client.status().version  # the empty bucket: the model as given, version 0
    rf = rollouts(client, current=served + 1, max_staleness=1)
    out = rf([seed_prompt(11)] * 2 + [seed_prompt(12)] * 2)
    assert len(out["prompt_ids"]) == 4 and all(r is not None for r in out["env_reward"])
    for ids, logprobs, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(ids) == len(logprobs) == len(mask) and 1 in mask
    secrets = [g.secret for g in rf.recent]
    assert secrets[0] == secrets[1] and secrets[2] == secrets[3]  # a GRPO group plays one word
    assert rf.counts.totals().model_dump() == {"games": 4, "replayed": 0, "dropped": 0, "max_seen": 1, "refused": 0}
    shares = [sum(1 for w in g.guesses if w) / len(g.guesses) for g in rf.recent]
    assert out["valid_share"] == shares  # the env's verdict on each move, per game
    assert out["letters"] == [letters_found(g.marks) for g in rf.recent]


def test_per_move_credit_trains_one_move_of_each_played_game(client: RolloutClient) -> None:
    rf = rollouts(client, current=client.status().version, max_staleness=1, max_turns=3, credit="move")
    out = rf([seed_prompt(21)] * 2 + [seed_prompt(22)] * 2)
    moves = []
    for i, game in enumerate(rf.recent):
        mask, ids = out["env_mask"][i], out["completion_ids"][i]
        trained = [j for j, m in enumerate(mask) if m]
        assert trained == list(range(trained[0], len(mask)))  # one reply, and the sample ends with it
        assert ids == game.completion_ids[:len(ids)]  # the game as played, up to that reply
        move = reply_spans(game.env_mask).index((trained[0], len(mask)))
        moves.append(move)
        assert out["env_reward"][i] == game.turn_rewards[move] and out["game_reward"][i] == game.reward
    assert moves[0] == moves[1] and moves[2] == moves[3]  # a group is trained on one move


def test_games_over_the_bound_are_replayed_then_dropped_and_counted(client: RolloutClient) -> None:
    served = client.status().version
    rf = rollouts(client, current=served + 2, max_staleness=1)  # the rollout cannot catch up: nothing publishes
    out = rf([seed_prompt(5)] * 2 + [seed_prompt(6)] * 2)
    assert out["env_reward"] == [None] * 4  # TRL gives unscorable rows zero advantage: no gradient
    assert len(out["completion_ids"]) == 4  # one row per prompt still, as TRL needs
    assert rf.counts.totals().model_dump() == {"games": 0, "replayed": 4, "dropped": 4, "max_seen": 0, "refused": 0}
    assert list(rf.recent) == []
