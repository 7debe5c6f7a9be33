"""rollout_space.versus: a person and a policy on the same word, against a real env server."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rollout_space.env_client import EnvClient
from rollout_space.versus import Match, Opponent, PrivateGames, VersusError
from wire.rollout import Trajectory

from ._env_server import running_server

POLICY_WORDS = ["slate", "crony", "bumph", "wight", "fjord", "vaunt"]
#: Served v4 as the match begins, no exam yet, an example in every message, at most 12 moves.
OPPONENT = Opponent(4, None, 1.0, 12)


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
    match = Match(env, scripted_policy(env), executor, OPPONENT, seed=1234)
    policy = match.policy.result(timeout=30)
    secret = policy.secret
    assert len(secret) == 5

    view = match.view()
    assert "6 guesses left" in view.human_status
    assert re.fullmatch(r"Policy v4 has played: (\d+) moves, (\d+) scored, 1 invalid\. Its scored rows show in "
                        r"colour as you play yours \(0 of \2 so far\)\.", view.policy_status), view.policy_status
    assert "data-mark" not in view.policy_board

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
    """While the policy plays, the person sees how far it got, its invalid moves as well as its rows (in colour
    only), its pace on this machine and how many moves may be left; and the opponent line names the version that
    played its moves, not the one served now."""
    two_moves, finish = threading.Event(), threading.Event()
    now = [100.0]

    def clock() -> float:
        return now[0]

    def slow(seed: int, progress: Any) -> Trajectory:
        now[0] += 20
        progress(game(replies=["<guess>zzzzz</guess>"], guesses=[""], versions=[5]))
        now[0] += 40
        progress(game(replies=["<guess>zzzzz</guess>", "<guess>slate</guess>"], guesses=["", "slate"],
                      marks=["XXXXX"], versions=[5, 5]))
        two_moves.set()
        finish.wait(10)
        return game(guesses=["", "slate"], marks=["XXXXX"], versions=[5, 6], invalid_moves=1,
                    replies=["<guess>zzzzz</guess>", "<guess>slate</guess>"], errors=["'zzzzz' is not in the word list", ""])

    match = Match(env, slow, executor, OPPONENT, clock=clock)
    assert two_moves.wait(10)
    view = match.view()
    assert view.policy_status == (
        "The policy is playing: 2 moves so far (1 scored, 1 invalid), about 30 s a move on this machine. Invalid "
        "moves use up no guess, so its game may take up to 10 more moves, about 5 more minutes at this pace.")
    assert re.findall(r'data-move="(\w+)">', view.policy_board) == ["invalid", "scored"]  # the invalid move drawn
    assert "zzzzz" not in view.policy_board  # without its text while the person plays
    assert view.opponent.startswith("Your opponent: **policy v5**. No exam yet")  # v5 played, v4 was served
    assert "example word (never the secret) in every message" in view.opponent
    match.guess("crane")
    assert match.view().policy_board.count('data-mark="X"') == 5 and "slate" not in match.view().policy_board
    finish.set()
    match.policy.result(timeout=10)
    assert match.view().opponent.startswith("Your opponent: **policy v5–v6** (new weights arrived during its game)")
    match.close()


def test_before_its_first_move_the_opponent_is_the_version_served_as_the_match_began(
        env: EnvClient, executor: ThreadPoolExecutor) -> None:
    release = threading.Event()

    def waiting(seed: int, progress: Any) -> Trajectory:
        release.wait(10)
        return game()

    match = Match(env, waiting, executor, Opponent(7, None, 0.0, 12))
    view = match.view()
    assert view.opponent.startswith("Your opponent: the policy as served when its first move is played (v7 as this "
                                    "match began)")
    assert "it plays by itself, as in its exam" in view.opponent  # no examples: said so
    release.set()
    match.policy.result(timeout=10)
    match.close()


def test_a_failing_policy_is_shown_not_raised(env: EnvClient, executor: ThreadPoolExecutor) -> None:
    def broken(seed: int, progress: Any) -> Trajectory:
        raise RuntimeError("engine down")

    match = Match(env, broken, executor, OPPONENT)
    match.policy.exception(timeout=10)
    assert match.view().policy_status == "The policy could not play: RuntimeError: engine down"
    match.close()


def test_an_unreachable_env_raises_versus_error(executor: ThreadPoolExecutor) -> None:
    with pytest.raises(VersusError, match="did not answer /reset"):
        Match(EnvClient("http://127.0.0.1:9", timeout=2), lambda seed, progress: game(), executor, OPPONENT)


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
