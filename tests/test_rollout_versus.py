"""rollout_space.versus: a person and a policy on the same word, against a real env server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rollout_space.env_client import EnvClient
from rollout_space.versus import Match, PrivateGames, VersusError
from wire.rollout import Trajectory

from ._env_server import running_server

POLICY_WORDS = ["slate", "crony", "bumph", "wight", "fjord", "vaunt"]


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    with running_server("env") as url:
        yield url


@pytest.fixture(scope="module")
def env(env_url: str) -> Iterator[EnvClient]:
    client = EnvClient(env_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


def game(episode_id: str = "e", **fields: Any) -> Trajectory:
    """A policy game as a stand-in policy reports it (no tokens: the match reads only the moves)."""
    return Trajectory(prompt_ids=[0], episode_id=episode_id, **fields)


def scripted_policy(env: EnvClient) -> Any:
    """A stand-in policy that plays fixed words through the env's HTTP API, as the rollout Space does."""

    def play(seed: int, progress: Any) -> Trajectory:
        obs = env.reset(seed=seed, weight_version=4)
        played = game(obs.episode_id)
        for word in ["zzzzz"] + POLICY_WORDS:
            obs = env.step(obs.episode_id, f"<guess>{word}</guess>")
            played.replies.append(f"<guess>{word}</guess>")
            played.guesses.append(obs.rows[-1].word if obs.last_move_valid else "")
            played.versions.append(4)
            played.marks = [r.marks for r in obs.rows]
            played.won, played.invalid_moves, played.finished = obs.won, obs.invalid_moves, obs.done
            played.secret, played.reward = obs.secret or "", obs.total_reward
            progress(played.model_copy(deep=True))
            if obs.done:
                break
        return played

    return play


def test_same_word_and_no_secret_before_the_end(env: EnvClient, executor: ThreadPoolExecutor) -> None:
    match = Match(env, scripted_policy(env), executor, seed=1234)
    policy = match.policy.result(timeout=30)
    secret = policy.secret
    assert len(secret) == 5

    view = match.view()
    assert "6 guesses left" in view.human_status
    assert "0 of its rows shown" in view.policy_status and "data-mark" not in view.policy_board

    match.guess("zzzzz")
    assert "Not accepted" in match.view().human_status
    first = match.guess("slate")
    assert len(first.rows) == 1
    view = match.view()
    assert view.policy_board.count("data-mark") == 5
    if not first.done:
        assert secret not in view.policy_board.lower() + view.policy_status.lower() + view.human_board.lower()

    for word in POLICY_WORDS[1:]:
        if match.human.done:
            break
        match.guess(word)
    assert match.human.done and match.human.secret == secret  # same seed, same word
    view = match.view()
    assert secret.upper() in view.human_status
    assert view.policy_status.startswith("Policy v4: ")
    assert ">s<" in view.policy_board and "1 invalid move" in view.policy_status  # letters now shown
    assert "1. invalid: &lt;guess&gt;zzzzz&lt;/guess&gt;" in view.policy_board  # and what it wrote
    match.close()


def test_the_policy_side_shows_its_moves_as_they_come(env: EnvClient, executor: ThreadPoolExecutor) -> None:
    """While the policy plays, the person sees how far it got and its rows in colour only."""
    two_moves, finish = threading.Event(), threading.Event()

    def slow(seed: int, progress: Any) -> Trajectory:
        progress(game(replies=["<guess>zzzzz</guess>"], guesses=[""]))
        progress(game(replies=["<guess>zzzzz</guess>", "<guess>slate</guess>"], guesses=["", "slate"], marks=["XXXXX"]))
        two_moves.set()
        finish.wait(10)
        return game(guesses=["", "slate"], marks=["XXXXX"], versions=[1, 1], invalid_moves=1)

    match = Match(env, slow, executor)
    assert two_moves.wait(10)
    view = match.view()
    assert view.policy_status == "The policy is thinking: 2 moves made so far..."
    match.guess("crane")
    assert match.view().policy_board.count('data-mark="X"') == 5 and "slate" not in match.view().policy_board
    finish.set()
    match.policy.result(timeout=10)
    match.close()


def test_a_failing_policy_is_shown_not_raised(env: EnvClient, executor: ThreadPoolExecutor) -> None:
    def broken(seed: int, progress: Any) -> Trajectory:
        raise RuntimeError("engine down")

    match = Match(env, broken, executor)
    match.policy.exception(timeout=10)
    assert match.view().policy_status == "The policy could not play: RuntimeError: engine down"
    match.close()


def test_an_unreachable_env_raises_versus_error(executor: ThreadPoolExecutor) -> None:
    with pytest.raises(VersusError, match="did not answer /reset"):
        Match(EnvClient("http://127.0.0.1:9", timeout=2), lambda seed, progress: game(), executor)


def test_private_games_stay_out_of_the_feed_and_freeze_it_while_playing() -> None:
    started, release = threading.Event(), threading.Event()

    def play(seed: int, progress: Any) -> Trajectory:
        started.set()
        release.wait(10)
        return game(f"match-{seed}")

    private = PrivateGames(play)
    feed = [game("public"), game("match-7")]
    assert private.visible(feed) == feed and private.changes == 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(private.play, 7, print)
        assert started.wait(10)
        assert private.visible(feed) is None and private.changes == 1  # in flight: keep the old feed
        release.set()
        assert future.result(timeout=10) == game("match-7")
    assert private.visible(feed) == [game("public")] and private.changes == 2

    def broken(seed: int, progress: Any) -> Trajectory:
        raise RuntimeError("engine down")

    failing = PrivateGames(broken)
    with pytest.raises(RuntimeError, match="engine down"):
        failing.play(1, print)
    assert failing.visible(feed) == feed and failing.changes == 2
