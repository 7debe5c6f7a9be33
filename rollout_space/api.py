"""The rollout Space's HTTP API: ``GET /health``, ``GET /status``, ``POST /generate``, ``POST /rollout``.

Handlers are plain functions: FastAPI runs them in its thread pool, and the engine's lock orders the
calls, so a long rollout never blocks ``/status``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from .engines import EngineError, SamplingParams
from .errors import EnvUnavailableError, LimitExceededError, RolloutError
from .games import GameSpec, PlayParams
from .service import RolloutService


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(64, ge=1, description="Most tokens per completion (per reply in games)")
    temperature: float = Field(1.0, ge=0, description="0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, description="Reproducible sampling for the same weights")


class GenerateRequest(_Sampling):
    """Body of ``POST /generate``."""

    prompts: list[str | list[int]] = Field(min_length=1, description="Texts (no special tokens added) or token ids")
    stop: list[int] | None = Field(None, description="Extra token ids that end a completion")


class GameRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(None, ge=0, description="Same seed, same secret word")
    secret: str | None = Field(None, description="Play this word")


class RolloutRequest(_Sampling):
    """Body of ``POST /rollout``."""

    games: list[GameRequest] = Field(min_length=1)
    max_tokens: int = Field(48, ge=1, description="Most tokens per reply")
    max_turns: int = Field(PlayParams.max_turns, ge=1, description="Most replies per game")
    reply_prefix: str = Field(PlayParams.reply_prefix, max_length=64,
                              description="Text that opens every reply, written for the policy (never sampled)")


_STATUS = {LimitExceededError: 413, EnvUnavailableError: 502, EngineError: 503, RolloutError: 409, ValueError: 422}


def build_api(service: RolloutService) -> FastAPI:
    """A FastAPI app serving `service` (the UI can be mounted on it afterwards)."""
    app = FastAPI(title="Rollout server", description="The latest published policy, following the bucket.")

    for error, code in _STATUS.items():
        app.add_exception_handler(error, _handler(code))

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    def status() -> dict[str, Any]:
        """Served `version`, `latest_version` in the bucket, `lag`, `engine`, `last_error`, ..."""
        return service.status()

    @app.post("/generate")
    def generate(request: GenerateRequest) -> dict[str, Any]:
        """One completion per prompt: token ids, sampled logprobs, and the weight version of each."""
        params = SamplingParams(request.max_tokens, request.temperature, request.top_p, request.seed,
                                tuple(request.stop or ()))
        completions = service.generate(request.prompts, params)
        return {"version": min(c.version for c in completions),
                "completions": [{"prompt_ids": c.prompt_ids, "token_ids": c.token_ids, "logprobs": c.logprobs,
                                 "text": c.text, "finish_reason": c.finish_reason, "version": c.version}
                                for c in completions]}

    @app.post("/rollout")
    def rollout(request: RolloutRequest) -> dict[str, Any]:
        """Whole Wordle games, one trajectory each, in the shape of TRL's `rollout_func` output."""
        params = PlayParams(request.max_tokens, request.temperature, request.top_p, request.max_turns, request.seed,
                            request.reply_prefix)
        games = [GameSpec(g.seed, g.secret) for g in request.games]
        return {"trajectories": [t.to_dict() for t in service.play(games, params)]}

    return app


def _handler(code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "error": type(exc).__name__}, status_code=code)

    return handle
