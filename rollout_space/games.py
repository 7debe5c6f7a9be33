"""Whole multi-turn Wordle games between the served policy and the env Space, as the trajectories TRL's
`GRPOTrainer` takes from a `rollout_func`: the instructions are the prompt; the replies and the env's feedback,
token for token as the model saw them, the completion, with `env_mask` 1 on the model's tokens. All live games
advance together: each turn is one batched `generate`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wire.env import GameKind, WordleObservation
from wire.rollout import Trajectory
from wire.wordle import CLOSE_TAG, MAX_GUESSES, OPEN_TAG

from .engines import Completion, Engine, SamplingParams
from .env_client import EnvClient

#: Stands for the model's reply while the chat template is rendered, to find the text around a reply.
_REPLY = "\ue000REPLY\ue000"

#: What opens each of the policy's replies by default, written for it: small models (SmolLM2-135M) asked to
#: "write your guess inside <guess></guess> tags" almost never write the tag within a reply's tokens,
#: so every game scores the same and GRPO has no gradient; opened with the tag, they name a word.
REPLY_PREFIX = OPEN_TAG


@dataclass(frozen=True)
class GameSpec:
    """Which word a game is played on: `secret` if given, else the env's pick from `seed` (the same seed, the same
    word: how GRPO groups compare like with like); `exam`: the held-out secret with that number, played without
    examples; `kind`: why it is played (`wire.env.GameKind`)."""

    seed: int | None = None
    secret: str | None = None
    exam: int | None = None
    kind: GameKind = GameKind.TRAINING

    def __post_init__(self) -> None:
        if (self.exam is not None) != (self.kind == GameKind.EXAM):
            raise ValueError(f"an exam game names its held-out secret (exam=N) and is of kind exam; got {self}")


@dataclass(frozen=True)
class PlayParams:
    """How the policy plays.

    Attributes:
        max_tokens: Most tokens per reply.
        temperature, top_p: Sampling of each reply (0 is greedy).
        max_turns: Most replies per game (invalid moves count).
        seed: Makes the games reproducible for the same weights (turn t samples with seed + t).
        reply_prefix: Text that opens every reply, never sampled (env_mask 0: never trained on); "" none.
        stop: Strings that end a reply (kept): the guess's closing tag by default.
        max_game_tokens: Most tokens of a game, prompt and completion (None: the engine's context length alone).
        examples: The probability that a game's messages show the env's example guess (`wire.curriculum`).
    """

    max_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 2 * MAX_GUESSES
    seed: int | None = None
    reply_prefix: str = REPLY_PREFIX
    stop: tuple[str, ...] = (CLOSE_TAG,)
    max_game_tokens: int | None = None
    examples: float = 1.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        if not 0 <= self.examples <= 1:
            raise ValueError(f"examples is a probability in [0, 1], got {self.examples}")
        SamplingParams(self.max_tokens, self.temperature, self.top_p)  # same checks as every sampling


class ChatLayout:
    """Token ids of the game's text laid out by the model's chat template. The feedback after a reply is tokenized on
    its own and appended after the sampled tokens, so the completion holds exactly the tokens the model saw."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._templated = getattr(tokenizer, "chat_template", None) is not None

    def prompt(self, message: str) -> list[int]:
        """The first user message and the opening of the assistant's turn."""
        if not self._templated:
            return self._tokenizer.encode(f"User: {message}\nAssistant:", add_special_tokens=False)
        return list(
            self._tokenizer.apply_chat_template(
                [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    def feedback(self, message: str, reply: Completion) -> list[int]:
        """What follows a reply: the end of the assistant's turn (unless the reply sampled it), the env's
        message as a user turn, and the opening of the next assistant turn."""
        if not self._templated:
            return self._tokenizer.encode(f"\nUser: {message}\nAssistant:", add_special_tokens=False)
        text = self._tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "."},
                {"role": "assistant", "content": _REPLY},
                {"role": "user", "content": message},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        after = text[text.index(_REPLY) + len(_REPLY) :]
        if reply.finish_reason == "stop" and reply.token_ids:
            after = after.removeprefix(self._tokenizer.decode(reply.token_ids[-1:]))
        return self._tokenizer.encode(after, add_special_tokens=False)

    def text(self, text: str) -> list[int]:
        """Plain text inside a turn (a reply's prefix), no special tokens added."""
        return self._tokenizer.encode(text, add_special_tokens=False) if text else []


def play_games(
    engine: Engine,
    env: EnvClient,
    games: Sequence[GameSpec],
    params: PlayParams | None = None,
    on_turn: Callable[[Sequence[Trajectory]], None] | None = None,
) -> list[Trajectory]:
    """Play each game to its end (or `params.max_turns`) with the engine's current policy: every turn of every live game
    is one prompt of one `engine.generate`, asking for the version the first turn played (`at`), and each reply
    records its version. `on_turn` sees the games after each turn (read, do not keep).

    Raises:
        EnvUnavailableError: the env failed; the games started are closed on the env first.
        EngineError: the engine failed.
    """
    params = params or PlayParams()
    layout = ChatLayout(engine.tokenizer)
    limit = min(engine.config.max_model_len, params.max_game_tokens or engine.config.max_model_len)
    prefix, prefix_ids = params.reply_prefix, layout.text(params.reply_prefix)
    live: list[Trajectory] = []
    shown: dict[str, str] = {}  # per game, the example guess the env's latest message showed
    try:
        for spec in games:
            examples = 0.0 if spec.exam is not None else params.examples
            observation = env.reset(
                seed=spec.seed,
                secret=spec.secret,
                weight_version=engine.version,
                examples=None if examples == 1 else examples,
                exam=spec.exam,
                kind=spec.kind,
            )
            live.append(
                Trajectory(
                    prompt_ids=layout.prompt(observation.message) + prefix_ids,
                    episode_id=observation.episode_id,
                    exam=spec.exam is not None,
                )
            )
            shown[observation.episode_id] = observation.example or ""
        pinned: int | None = None  # the version of the first turn
        for turn in range(params.max_turns):
            playing = [
                g
                for g in live
                if not g.finished and len(g.prompt_ids) + len(g.completion_ids) + params.max_tokens <= limit
            ]
            if not playing:
                break
            sampling = SamplingParams(
                params.max_tokens,
                params.temperature,
                params.top_p,
                None if params.seed is None else params.seed + turn,
                stop=params.stop,
            )
            replies = engine.generate([g.prompt_ids + g.completion_ids for g in playing], sampling, at=pinned)
            pinned = replies[0].version if pinned is None else pinned
            for game, reply in zip(playing, replies, strict=True):
                _reply(game, reply, prefix)
                game.examples.append(shown[game.episode_id])
                observation = env.step(game.episode_id, prefix + reply.text)
                shown[game.episode_id] = observation.example or ""
                _observe(game, observation)
                if not observation.done:
                    _feedback(game, layout.feedback(observation.message, reply) + prefix_ids)
            if on_turn is not None:
                on_turn(live)
    finally:
        for game in live:
            if not game.finished:
                env.close_game(game.episode_id)
    return live


def _reply(game: Trajectory, completion: Completion, prefix: str) -> None:
    """Append the policy's reply: its tokens are the model's (mask 1), with their logprobs and versions (the engine's
    spans, moved to where the reply starts in the game)."""
    start = len(game.completion_ids)
    game.spans += [s.model_copy(update={"start": s.start + start, "end": s.end + start}) for s in completion.spans]
    game.versions_reported = completion.versions_reported
    game.straddled += completion.straddles
    game.completion_ids += completion.token_ids
    game.logprobs += completion.logprobs
    game.env_mask += [1] * len(completion.token_ids)
    game.replies.append(prefix + completion.text)
    game.versions.append(completion.version)


def _feedback(game: Trajectory, ids: list[int]) -> None:
    """Append the env's tokens between two replies (mask 0, logprob 0)."""
    game.completion_ids += ids
    game.logprobs += [0.0] * len(ids)
    game.env_mask += [0] * len(ids)


def _observe(game: Trajectory, observation: WordleObservation) -> None:
    """Take the env's verdict on the last reply: the env keeps the one record of a game's result."""
    game.turn_rewards.append(observation.reward or 0.0)
    game.reward = observation.total_reward
    rows = observation.rows
    game.guesses.append(rows[-1].word if observation.last_move_valid and rows else "")
    game.copied.append(bool(observation.copied))
    game.errors.append("" if observation.last_move_valid else observation.error or "invalid move")
    game.marks = [row.marks for row in rows]
    game.won = observation.won
    game.invalid_moves = observation.invalid_moves
    game.secret = observation.secret or ""
    game.finished = observation.done
