"""One whole Wordle game as a GRPO sample: what the rollout Space plays and the trainer trains on.

It crosses between the apps twice: in the rollout's ``POST /rollout`` answer (request mode) and inside
the game groups the rollout servers write to the bucket (`wire.fleet`). Pydantic only: light to import.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, computed_field

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
    versions: list[Version] = Field([], description="The weight version of each reply")
    finished: bool = Field(
        False, description="False if the game was cut (max_turns or the model's context length) before the env ended it"
    )

    @computed_field  # type: ignore[prop-decorator]  # pydantic's computed field over a property, as its docs write it
    @property
    def version(self) -> int:
        """The oldest weight version that produced any reply (-1 before the first): a trainer judges staleness
        on it."""
        return min(self.versions) if self.versions else -1
