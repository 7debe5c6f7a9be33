"""The one request model of the three apps' HTTP APIs: every body they read is a `RequestBody`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestBody(BaseModel):
    """Base of every request body: each field takes its own JSON type only (``"8"`` is no integer, ``"yes"`` no
    boolean; an integer may stand for a float), NaN and infinities are refused, and so are unknown fields (the env's
    bodies ignore them instead, as OpenEnv's clients send more). A mistyped body is refused with 422, never coerced:
    a caller whose client sends strings learns it at once instead of playing a game on a guessed value."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
