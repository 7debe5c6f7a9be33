"""What the rollout Space's HTTP API answers: its status, completions, and whole games as trajectories.

The server's routes return these models (FastAPI's response models, shown at ``/docs``) and the trainer's
`trainer_space.rollout_client.RolloutClient` returns them parsed, so both sides read one definition. The
engines return `Completion` and `rollout_space.games.play_games` builds `Trajectory`: the objects served are
the ones computed, with no copy into another shape. The request bodies are in `rollout_space.api`. Pydantic
only: light to import (the launcher's landing page reads `RolloutStatus` without loading torch).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from wire.lora import LoraSettings
from wire.traffic import BucketTraffic
from wire.trajectory import Trajectory, VersionSpan, check_spans

__all__ = ["Completion", "GenerateResponse", "RolloutResponse", "RolloutStatus", "Trajectory"]


class RolloutStatus(BaseModel):
    """The answer of ``GET /status``: what is served, how far behind the bucket, what went wrong."""

    version: int = Field(description="The weight version served")
    latest_version: int | None = Field(
        description="The bucket's newest version; None while it has none (or without a bucket)"
    )
    lag: int | None = Field(description="Versions between the bucket's newest and the one served")
    engine: str = Field(description="The inference engine: transformers or vllm")
    device: str
    model: str
    bucket: str | None
    env_url: str | None = Field(description="The env Space games are played on; None: games are refused")
    last_error: str | None = Field(description="The last failure to follow the bucket (the served version stays)")
    state_hash: str | None = Field(
        description="Hash of the weights served, comparable with the manifest's; None "
        "before a bucket version is served, and when the engine computes in a "
        "dtype that rounds the published weights (bf16 served as float16)"
    )
    failures: int = Field(
        description="Failed syncs since the server started (bad files, an unreachable bucket): each was recovered "
        "from or retried"
    )
    note: str | None = Field(description="Why the model is served as loaded (no bucket, an empty bucket)")
    syncs: int = Field(description="Versions applied and remembered for the UI's timeline")
    tokens_served: int = Field(description="Tokens generated since the start (the model's own, in games)")
    games_played: int
    straddled: int = Field(
        0, description="Replies in its games whose tokens were sampled by more than one weight version"
    )
    versions_reported: bool | None = Field(
        None,
        description="Whether its engine reports which weights sampled each token (vLLM >= 0.32: its weight-version "
        "spans); False: each reply carries the version served when it was asked for; None: no game yet",
    )
    busy_s: float = Field(
        0.0,
        description="Seconds spent playing games since the start (for the trainer, the "
        "fleet or visitors): the rest of the time it had nothing to play",
    )
    server_id: str | None = Field(None, description="Its name in the fleet (None: it plays no games for the fleet)")
    fleet_state: str | None = Field(
        None, description="starting, producing, full (back-pressure), waiting for step 1, paused, no run or error"
    )
    fleet_run: str | None = Field(None, description="The fleet run it produces for")
    groups_written: int = Field(0, description="Game groups handed in through the bucket since it started")
    lora: LoraSettings | None = Field(None, description="The LoRA run followed (`wire.lora`; None: full weights)")
    adapters: str = Field("", description="Which LoRA adapters the engine serves (adapter-mode runs), in a few words")
    refused: dict[str, int] = Field(
        default_factory=dict,
        description="LoRA runs and adapter versions refused, by kind "
        "(another base, no LoRA support, rank above max, adapter failed, bad adapter), and "
        "versions and run settings not signed by the trainer's key (untrusted version, "
        "untrusted run settings)",
    )
    last_refusal: str | None = Field(
        None,
        description="Why the last version or run settings not signed by the "
        "trainer's key were refused (the served version stays)",
    )
    trust: str = Field(
        "",
        description="Which key the weights and the run's settings are checked with, and why it is "
        "trusted (given, or trusted on first use); or that they are not checked",
    )
    authenticated: bool = Field(
        True,
        description="False when the bucket is followed unauthenticated: whoever writes "
        "to it decides the weights served",
    )
    bucket_traffic: BucketTraffic | None = Field(
        None,
        description="Requests this server sent to its bucket, by class, "
        "per 5 minutes and in all, and whether the "
        "bucket's server asked it to slow down (None "
        "without a bucket)",
    )


class Completion(BaseModel):
    """One generated completion, as an engine returns it and ``POST /generate`` sends it."""

    model_config = ConfigDict(frozen=True)

    prompt_ids: list[int] = Field(description="The prompt's token ids")
    token_ids: list[int] = Field(
        description="The sampled token ids, the stop token included when generation stopped on one"
    )
    logprobs: list[float] = Field(
        description="Per sampled token, its log-probability under the model's raw "
        "distribution (log_softmax of the logits, before temperature or "
        "top-p): what an RL trainer compares with"
    )
    text: str = Field(description="token_ids decoded, special tokens skipped")
    finish_reason: str = Field(
        description="stop (a stop token was sampled) or length (max_tokens or the model's context length reached)"
    )
    version: int = Field(
        description="The weight version served when it was asked for: every token's, unless `spans` say otherwise"
    )
    spans: list[VersionSpan] = Field(
        [],
        description="The weight version of each range of its tokens: as the engine reported them (vLLM's "
        "weight-version spans: `versions_reported`), else one span of `version` over all of them",
    )
    versions_reported: bool = Field(
        False, description="Whether the engine reported which weights sampled each token (else: `version` for all)"
    )

    @model_validator(mode="after")
    def _spans_in_order(self) -> Completion:
        check_spans(self.spans, len(self.token_ids))
        return self

    @property
    def straddles(self) -> bool:
        """Whether more than one weight version sampled its tokens (a weight update landed while it was generated)."""
        return len({s.version for s in self.spans}) > 1


class GenerateResponse(BaseModel):
    """The answer of ``POST /generate``: one completion per prompt, in order."""

    version: int = Field(description="The oldest weight version among the completions")
    completions: list[Completion]


class RolloutResponse(BaseModel):
    """The answer of ``POST /rollout``: one trajectory per game asked for, in order."""

    trajectories: list[Trajectory]
