"""Whole Wordle games between a tiny policy and a real env server, as GRPO trajectories."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from rollout_space.engines import EngineConfig, open_engine
from rollout_space.env_client import EnvClient
from rollout_space.errors import EnvUnavailableError
from rollout_space.games import GameSpec, PlayParams, play_games
from tests._engines import build_model
from tests._env_server import running_server


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = build_model(str(tmp_path_factory.mktemp("model")), seed=3)
    with open_engine("transformers", EngineConfig(folder, dtype="float32", max_model_len=4096)) as e:
        yield e


@pytest.fixture(scope="module")
def env():
    with running_server("env") as url:
        client = EnvClient(url)
        yield client
        client.close()


def test_trajectories_hold_exactly_the_tokens_the_policy_saw(engine, env):
    games = play_games(engine, env, [GameSpec(seed=7), GameSpec(seed=7), GameSpec(secret="crane")],
                       PlayParams(max_tokens=12, temperature=1.0, max_turns=3, seed=1))
    assert len(games) == 3
    for game in games:
        n = len(game.completion_ids)
        assert len(game.logprobs) == len(game.env_mask) == n > 0
        assert len(game.replies) == len(game.turn_rewards) == len(game.guesses) == len(game.versions) == 3
        assert len(game.errors) == 3 and all(bool(e) != bool(g) for e, g in zip(game.errors, game.guesses))
        # The example guess each reply was shown: the instructions' first, then each request's own.
        assert game.examples[0] == "crane" and len(set(game.examples)) == 3
        assert game.version == 0 and game.versions == [0, 0, 0]
        # Each reply's tokens carry its version (this engine reports none per token: the version asked for).
        assert not game.versions_reported and game.straddled == 0
        assert game.token_versions() == [0 if m else -1 for m in game.env_mask]
        assert all(lp == 0.0 for lp, m in zip(game.logprobs, game.env_mask) if m == 0)
        # The env's feedback sits between the replies (a random model never wins in 3 turns).
        feedback = engine.tokenizer.decode([t for t, m in zip(game.completion_ids, game.env_mask) if m == 0])
        assert "guess" in feedback.lower()
        assert "Wordle" in engine.tokenizer.decode(game.prompt_ids)
        # The model's tokens are scored the same by a fresh pass over prompt + completion: the
        # trajectory is what the model saw, token for token, so a trainer recomputes the same logprobs.
        [scores] = engine.prompt_logprobs([game.prompt_ids + game.completion_ids])
        mine = [s for s, m in zip(scores[len(game.prompt_ids) - 1:], game.env_mask) if m == 1]
        sampled = [lp for lp, m in zip(game.logprobs, game.env_mask) if m == 1]
        assert mine == pytest.approx(sampled, abs=1e-4)
    # The same seed gives the same word (GRPO groups compare games on one word); a secret is played as given.
    assert not games[0].finished and games[0].secret == ""  # cut by max_turns: the env did not reveal it
    assert not any(g.won for g in games)


def test_each_reply_opens_with_the_prefix_written_for_the_policy(engine, env):
    opened, free = (play_games(engine, env, [GameSpec(secret="crane")],
                               PlayParams(max_tokens=6, max_turns=2, seed=4, reply_prefix=prefix))[0]
                    for prefix in ("<guess>", ""))
    tokens = engine.tokenizer
    assert tokens.decode(opened.prompt_ids).endswith("<guess>") and not tokens.decode(free.prompt_ids).endswith("<guess>")
    assert all(r.startswith("<guess>") for r in opened.replies) and len(opened.replies) == 2
    # The prefix is the player's, not the model's: after each feedback it is env tokens (mask 0), and the
    # move the env scored (its record of the game) is prefix + what the model sampled.
    feedback = tokens.decode([t for t, m in zip(opened.completion_ids, opened.env_mask) if m == 0])
    assert feedback.endswith("<guess>")
    records = httpx.get(f"{env.url}/games", params={"limit": 200}).json()
    [record] = [g for g in records if g["episode_id"] == opened.episode_id]
    assert list(record["replies"]) == opened.replies


def test_finished_games_carry_the_secret_and_the_env_total(engine, env):
    # max_invalid_moves defaults to a few: a random model's replies end the game as invalid moves.
    games = play_games(engine, env, [GameSpec(seed=11)], PlayParams(max_tokens=8, max_turns=12, seed=2))
    [game] = games
    assert game.finished and game.secret and not game.won
    assert game.reward == pytest.approx(sum(game.turn_rewards))
    assert game.model_dump()["version"] == 0 and set(game.model_dump()) >= {
        "prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "won", "version", "versions"}


def test_same_seed_same_word(engine, env):
    games = play_games(engine, env, [GameSpec(seed=5), GameSpec(seed=5), GameSpec(seed=6)],
                       PlayParams(max_tokens=4, max_turns=12, seed=3))
    assert all(g.finished for g in games)
    assert games[0].secret == games[1].secret != games[2].secret


def test_games_stop_before_the_context_is_full(tmp_path, env):
    folder = build_model(str(tmp_path), seed=3)
    with open_engine("transformers", EngineConfig(folder, max_model_len=600)) as small:
        [game] = play_games(small, env, [GameSpec(seed=11)], PlayParams(max_tokens=8, max_turns=12, seed=2))
    assert not game.finished and 1 <= len(game.replies) < 6
    assert len(game.prompt_ids) + len(game.completion_ids) + 8 > 600


def test_an_unreachable_env_is_a_clear_error(engine):
    env = EnvClient("http://127.0.0.1:9", timeout=2)
    with pytest.raises(EnvUnavailableError, match="did not answer /reset.*--env-url"):
        play_games(engine, env, [GameSpec(seed=1)])


def test_every_turn_asks_for_the_version_the_first_turn_played(engine, env):
    """`Engine.generate(at=...)`: an engine that keeps older versions (vLLM's LoRA adapters) plays the whole group
    under one version, whatever is loaded between its turns."""
    asked = []

    class Recording:  # the engine as `play_games` sees it, noting what each turn asks for
        def generate(self, prompts, params=None, *, at=None):
            asked.append(at)
            return engine.generate(prompts, params, at=at)

        def __getattr__(self, name):
            return getattr(engine, name)

    play_games(Recording(), env, [GameSpec(seed=7), GameSpec(seed=8)], PlayParams(max_tokens=4, max_turns=3, seed=1))
    assert asked == [None, engine.version, engine.version]


@dataclass
class WeightVersionSpan:
    """vLLM 0.34's span, as `vllm/outputs.py` defines it (read from its wheel): output tokens [start, end) were
    sampled by the weights labelled `version` (the string a follower set, here the delta version)."""

    version: str
    start: int
    end: int


def test_a_reply_that_straddles_two_versions_keeps_each_token_s_version(engine, env, monkeypatch):
    """An engine that reports spans as vLLM does, a weight update landing after the third token of every reply: the
    game keeps each token's version where the reply sits in it, counts the replies that straddled, and its oldest
    version is the oldest token's."""
    from rollout_space.engines.base import Sampled
    from rollout_space.engines.vllm_engine import reported_spans

    generate = engine._generate

    def straddling(prompts, params, version):
        out = []
        for s in generate(prompts, params, version):
            n = len(s.token_ids)
            spans = [WeightVersionSpan(str(version), 0, 3), WeightVersionSpan(str(version + 1), 3, n)] if n > 3 else [
                WeightVersionSpan(str(version), 0, n)]
            out.append(Sampled(s.token_ids, s.logprobs, s.finish_reason, reported_spans(spans, n)))
        return out

    monkeypatch.setattr(engine, "_generate", straddling)
    [game] = play_games(engine, env, [GameSpec(secret="crane")], PlayParams(max_tokens=8, max_turns=2, seed=3,
                                                                           stop=()))
    replies = reply_runs(game.env_mask)
    assert len(replies) == 2 and all(end - start == 8 for start, end in replies)  # no stop: max_tokens each
    assert game.versions_reported and game.straddled == 2 and game.version == 0 and game.newest_version == 1
    expected = [-1] * len(game.completion_ids)
    for start, end in replies:
        expected[start:end] = [0, 0, 0] + [1] * (end - start - 3)
    assert game.token_versions() == expected
    assert type(game).model_validate_json(game.model_dump_json()) == game  # as it crosses to the trainer


def reply_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of the model's own tokens."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs
