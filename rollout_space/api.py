"""The rollout Space's HTTP API: ``GET /health``, ``GET /status``, ``POST /generate``, ``POST /rollout``.

``/generate`` and ``/rollout`` are the trainer's: with a token set (``--token``/``ROLLOUT_TOKEN``) they
answer 401 unless the request carries ``Authorization: Bearer <token>``. They run on their own small
thread pool and ``/status`` on another, so however many generate calls wait on the engine, ``/health``
(async) and ``/status`` still answer at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Annotated, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from webguard import MAX_INT63, RequestBody, bearer_token, guard_app, refusal, token_matches
from wire.errors import RolloutError
from wire.rollout import GenerateResponse, RolloutResponse, RolloutStatus

from .engines import EngineError, PromptError, SamplingParams
from .errors import EnvUnavailableError, LimitExceededError
from .games import GameSpec, PlayParams
from .service import RolloutService

#: Largest request body: 256 prompts of 2,048 token ids as JSON fit in well under this.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: Static bounds of the schemas; the server's own caps (``ServiceLimits``) are usually lower.
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 65_536
MAX_TOKENS = 65_536
MAX_TOKEN_ID = 2**31 - 1

_T = TypeVar("_T")
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1, max_length=MAX_TOKENS)]


class _Sampling(RequestBody):
    max_tokens: int = Field(64, ge=1, le=MAX_TOKENS, description="Most tokens per completion (per reply in games)")
    temperature: float = Field(1.0, ge=0, le=100, description="0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=MAX_INT63, description="Reproducible sampling for the same weights")


class GenerateRequest(_Sampling):
    """Body of ``POST /generate``. Prompt lengths are checked in characters here, before tokenizing."""

    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)] | TokenIds] = Field(
        min_length=1, max_length=MAX_PROMPTS, description="Texts (no special tokens added) or token ids"
    )
    stop: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]] | None = Field(
        None, max_length=64, description="Extra token ids that end a completion"
    )


class GameRequest(RequestBody):
    seed: int | None = Field(None, ge=0, le=MAX_INT63, description="Same seed, same secret word")
    secret: str | None = Field(None, max_length=32, description="Play this word")


class RolloutRequest(_Sampling):
    """Body of ``POST /rollout``."""

    games: list[GameRequest] = Field(min_length=1, max_length=MAX_PROMPTS)
    max_tokens: int = Field(48, ge=1, le=MAX_TOKENS, description="Most tokens per reply")
    max_turns: int = Field(PlayParams.max_turns, ge=1, le=64, description="Most replies per game")
    reply_prefix: str = Field(
        PlayParams.reply_prefix,
        max_length=64,
        description="Text that opens every reply, written for the policy (never sampled)",
    )
    examples: float = Field(
        PlayParams.examples,
        ge=0,
        le=1,
        description="The probability that a game's messages show the env's example guess",
    )


#: The errors a request can cause, and their answers. Anything else is a bug: a 500, logged with its
#: traceback (never a 4xx that would blame the caller).
_STATUS = {LimitExceededError: 413, PromptError: 422, EnvUnavailableError: 502, EngineError: 503, RolloutError: 409}


def build_api(service: RolloutService, token: str | None = None) -> FastAPI:
    """A FastAPI app serving `service` (the UI can be mounted on it afterwards).

    Args:
        token: What ``/generate`` and ``/rollout`` require as a bearer token; None: open to all.
    """
    app = guard_app(
        FastAPI(title="Rollout server", description="The latest published policy, following the bucket."),
        MAX_BODY_BYTES,
    )
    engine_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollout-engine")
    status_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rollout-status")

    for error, code in _STATUS.items():
        app.add_exception_handler(error, _handler(code))

    def trainer_only(request: Request) -> None:
        if token is not None and not token_matches(bearer_token(request.headers), token):
            raise HTTPException(
                401,
                "this route needs the rollout token: send Authorization: Bearer <ROLLOUT_TOKEN> "
                "(the trainer's --rollout-token)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def run(pool: ThreadPoolExecutor, call: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(pool, call)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    async def status() -> RolloutStatus:
        """Served `version`, `latest_version` in the bucket, `lag`, `engine`, `last_error`, ..."""
        return await run(status_pool, service.status)

    @app.post("/generate", dependencies=[Depends(trainer_only)])
    async def generate(request: GenerateRequest) -> GenerateResponse:
        """One completion per prompt: token ids, sampled logprobs, and the weight version of each."""
        params = SamplingParams(
            request.max_tokens, request.temperature, request.top_p, request.seed, tuple(request.stop or ())
        )
        completions = await run(engine_pool, partial(service.generate, request.prompts, params))
        return GenerateResponse(version=min(c.version for c in completions), completions=completions)

    @app.post("/rollout", dependencies=[Depends(trainer_only)])
    async def rollout(request: RolloutRequest) -> RolloutResponse:
        """Whole Wordle games, one trajectory each, in the shape of TRL's `rollout_func` output."""
        params = PlayParams(
            request.max_tokens,
            request.temperature,
            request.top_p,
            request.max_turns,
            request.seed,
            request.reply_prefix,
            examples=request.examples,
        )
        games = [GameSpec(g.seed, g.secret) for g in request.games]
        trajectories = await run(engine_pool, partial(service.play, games, params))
        return RolloutResponse(trajectories=trajectories)

    return app


def _handler(code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return refusal(code, str(exc), type(exc).__name__)

    return handle
