"""One whole Wordle game as a GRPO sample: what the rollout Space plays and the trainer trains on.

It crosses between the apps twice: in the rollout's ``POST /rollout`` answer (request mode) and inside
the game groups the rollout servers write to the bucket (`wire.fleet`). Pydantic only: light to import.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

#: Bounds of what a game may hold, whoever wrote it (the fleet's files are written by strangers): token ids fit
#: an int32 embedding index (the run's vocabulary bounds them further, `wire.fleet_checks`), a log-probability
#: is finite and at most 0, a reward finite and at most `MAX_REWARD` in size (the env's rewards are a few units).
MAX_TOKEN_ID = 2**31 - 1
MAX_REWARD = 1000.0
MAX_VERSION = 2**53
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
LogProb = Annotated[float, Field(le=0.0, allow_inf_nan=False)]
Reward = Annotated[float, Field(ge=-MAX_REWARD, le=MAX_REWARD, allow_inf_nan=False)]
Version = Annotated[int, Field(ge=0, le=MAX_VERSION)]


class VersionSpan(BaseModel):
    """Tokens ``[start, end)`` of a completion were sampled by the weights of `version` (vLLM's `WeightVersionSpan`,
    its label read as the delta version the follower set it to)."""

    model_config = ConfigDict(frozen=True)

    version: Version
    start: int = Field(ge=0, le=MAX_TOKEN_ID)
    end: int = Field(ge=0, le=MAX_TOKEN_ID)


def check_spans(spans: list[VersionSpan], length: int) -> None:
    """Raise ValueError unless `spans` are non-empty ranges, in order, not overlapping, within `length` tokens."""
    end = 0
    for span in spans:
        if not end <= span.start < span.end <= length:
            raise ValueError(
                f"version span [{span.start}, {span.end}) is empty, out of order or past the {length} completion "
                "tokens: spans must be ranges in order that do not overlap"
            )
        end = span.end


class Trajectory(BaseModel):
    """One whole game as a GRPO sample, in the shape TRL's `GRPOTrainer` takes from a `rollout_func`.

    `games.play_games` fills it turn by turn (so it is not frozen); once returned it is not changed.
    """

    prompt_ids: list[TokenId] = Field(
        description="The chat-templated instructions, ending with the assistant's turn opening (and the reply prefix)"
    )
    episode_id: str = Field(description="The env's name for the game")
    completion_ids: list[TokenId] = Field(
        [],
        description="Every reply and the env's feedback between replies, "
        "concatenated, token for token as the model saw them",
    )
    logprobs: list[LogProb] = Field(
        [], description="Per completion token, its log-probability under the policy (0.0 on env tokens)"
    )
    env_mask: list[int] = Field([], description="Per completion token, 1 if the model produced it, 0 if the env did")
    reward: Reward = Field(0.0, description="The env's total reward for the game")
    turn_rewards: list[Reward] = Field([], description="The env's reward for each reply")
    won: bool = Field(False, description="Whether the policy found the word")
    guesses: list[str] = Field([], description="The word of each reply ('' when the move was invalid)")
    errors: list[str] = Field([], description="The env's reason for each invalid move ('' for a scored guess)")
    examples: list[str] = Field(
        [], description="The example guess the env's message before each reply showed ('' from an env that shows none)"
    )
    copied: list[bool] = Field(
        [],
        description="Per reply, whether it scored a word a message of the game had shown "
        "before it (the env's verdict: not the policy's own word)",
    )
    exam: bool = Field(False, description="An exam game (a held-out secret, no examples): never trained on")
    marks: list[str] = Field([], description="Feedback per valid guess, one of G/Y/X per letter")
    replies: list[str] = Field(
        [], description="The text of each reply, its reply prefix included (the move the env scored)"
    )
    invalid_moves: int = Field(
        0, ge=0, le=1000, description="The env's count of invalid moves (the env is the one record of a game's result)"
    )
    secret: str = Field("", description="The word ('' if the game ended unfinished, before the env revealed it)")
    versions: list[Version] = Field(
        [], description="The weight version of each reply: the one served when it was asked for"
    )
    spans: list[VersionSpan] = Field(
        [],
        description="The weight version of each range of the model's tokens (indexes into completion_ids), as the "
        "engine reported it (vLLM's weight-version spans) or, where it reports none, each reply's version; empty in "
        "games from servers that record none (then every model token counts as the game's oldest version)",
    )
    versions_reported: bool = Field(
        False, description="Whether the engine reported which weights sampled each token (else: per reply)"
    )
    straddled: int = Field(
        0, ge=0, le=1000, description="Replies whose tokens were sampled by more than one weight version"
    )
    finished: bool = Field(
        False, description="False if the game was cut (max_turns or the model's context length) before the env ended it"
    )

    @model_validator(mode="after")
    def _spans_in_order(self) -> Trajectory:
        check_spans(self.spans, len(self.completion_ids))
        return self

    @computed_field  # type: ignore[prop-decorator]  # pydantic's computed field over a property, as its docs write it
    @property
    def version(self) -> int:
        """The oldest weight version that produced any token (-1 before the first reply): a trainer judges staleness
        on it."""
        versions = [*self.versions, *(s.version for s in self.spans)]
        return min(versions) if versions else -1

    @property
    def newest_version(self) -> int:
        """The newest weight version that produced any token (-1 before the first reply)."""
        return max([*self.versions, *(s.version for s in self.spans)], default=-1)

    def token_versions(self) -> list[int]:
        """Per completion token, the weight version that sampled it; -1 on the env's tokens (and on model tokens no
        span covers, in games from servers that record no spans: then the model's tokens get the game's oldest
        version)."""
        if not self.spans:
            return [self.version if m else -1 for m in self.env_mask]
        out = [-1] * len(self.completion_ids)
        for span in self.spans:
            out[span.start : span.end] = [span.version] * (span.end - span.start)
        return out
