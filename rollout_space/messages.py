"""What the rollout Space's HTTP API answers: its status, completions, and whole games as trajectories.

The server's routes return these models (FastAPI's response models, shown at ``/docs``) and
`client.RolloutClient` returns them parsed, so both sides read one definition. The engines return
`Completion` and `games.play_games` builds `Trajectory`: the objects served are the ones computed,
with no copy into another shape. The request bodies are in `api`. Pydantic only: light to import
(the launcher's landing page reads `RolloutStatus` without loading torch).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field


class RolloutStatus(BaseModel):
    """The answer of ``GET /status``: what is served, how far behind the bucket, what went wrong."""

    version: int = Field(description="The weight version served")
    latest_version: int | None = Field(description="The bucket's newest version; None while it has none "
                                                   "(or without a bucket)")
    lag: int | None = Field(description="Versions between the bucket's newest and the one served")
    engine: str = Field(description="The inference engine: transformers or vllm")
    device: str
    model: str
    bucket: str | None
    env_url: str | None = Field(description="The env Space games are played on; None: games are refused")
    last_error: str | None = Field(description="The last failure to follow the bucket (the served version stays)")
    state_hash: str | None = Field(description="Hash of the weights served, comparable with the manifest's; None "
                                               "before a bucket version is served")
    failures: int = Field(description="Failed syncs in a row")
    note: str | None = Field(description="Why the model is served as loaded (no bucket, an empty bucket)")
    syncs: int = Field(description="Versions applied and remembered for the UI's timeline")
    tokens_served: int = Field(description="Tokens generated since the start (the model's own, in games)")
    games_played: int


class Completion(BaseModel):
    """One generated completion, as an engine returns it and ``POST /generate`` sends it."""

    model_config = ConfigDict(frozen=True)

    prompt_ids: list[int] = Field(description="The prompt's token ids")
    token_ids: list[int] = Field(description="The sampled token ids, the stop token included when generation "
                                             "stopped on one")
    logprobs: list[float] = Field(description="Per sampled token, its log-probability under the model's raw "
                                              "distribution (log_softmax of the logits, before temperature or "
                                              "top-p): what an RL trainer compares with")
    text: str = Field(description="token_ids decoded, special tokens skipped")
    finish_reason: str = Field(description="stop (a stop token was sampled) or length (max_tokens or the "
                                           "model's context length reached)")
    version: int = Field(description="The weight version that produced every token of it")


class GenerateResponse(BaseModel):
    """The answer of ``POST /generate``: one completion per prompt, in order."""

    version: int = Field(description="The oldest weight version among the completions")
    completions: list[Completion]


class Trajectory(BaseModel):
    """One whole game as a GRPO sample, in the shape TRL's `GRPOTrainer` takes from a `rollout_func`.

    `games.play_games` fills it turn by turn (so it is not frozen); once returned it is not changed.
    """

    prompt_ids: list[int] = Field(description="The chat-templated instructions, ending with the assistant's turn "
                                              "opening (and the reply prefix)")
    episode_id: str = Field(description="The env's name for the game")
    completion_ids: list[int] = Field([], description="Every reply and the env's feedback between replies, "
                                                      "concatenated, token for token as the model saw them")
    logprobs: list[float] = Field([], description="Per completion token, its log-probability under the policy "
                                                  "(0.0 on env tokens)")
    env_mask: list[int] = Field([], description="Per completion token, 1 if the model produced it, 0 if the env did")
    reward: float = Field(0.0, description="The env's total reward for the game")
    turn_rewards: list[float] = Field([], description="The env's reward for each reply")
    won: bool = Field(False, description="Whether the policy found the word")
    guesses: list[str] = Field([], description="The word of each reply ('' when the move was invalid)")
    errors: list[str] = Field([], description="The env's reason for each invalid move ('' for a scored guess)")
    marks: list[str] = Field([], description="Feedback per valid guess, one of G/Y/X per letter")
    replies: list[str] = Field([], description="The text of each reply, its reply prefix included (the move the "
                                               "env scored)")
    invalid_moves: int = Field(0, description="The env's count of invalid moves (the env is the one record of a "
                                              "game's result)")
    secret: str = Field("", description="The word ('' if the game ended unfinished, before the env revealed it)")
    versions: list[int] = Field([], description="The weight version of each reply")
    finished: bool = Field(False, description="False if the game was cut (max_turns or the model's context "
                                              "length) before the env ended it")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> int:
        """The oldest weight version that produced any reply (-1 before the first): a trainer judges staleness
        on it."""
        return min(self.versions) if self.versions else -1


class RolloutResponse(BaseModel):
    """The answer of ``POST /rollout``: one trajectory per game asked for, in order."""

    trajectories: list[Trajectory]
