"""The errors the rollout Space raises besides the engines' own (``rollout_space.engines.errors``); their base,
`RolloutError`, is the one its clients raise (``wire.errors``)."""

from __future__ import annotations

from wire.errors import RolloutError


class EnvUnavailableError(RolloutError):
    """The env Space did not answer, or refused a request; the message says which and what to check."""


class LoraRefusedError(RolloutError, ValueError):
    """A run this server does not follow (another base model, an engine that serves no adapter or not that rank, targets
    that are not linear layers of the model, more adapter versions to keep than the cap, a switch of what the bucket's
    versions are under a server that serves one); the message says which, in one line, and the server serves what it
    served before.

    Attributes:
        reason: A few words naming the kind of refusal, as the status counts them (`REFUSALS`).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


#: The kinds of refusal a rollout server counts in its status (`RolloutStatus.refused`): a LoRA run or adapter version
#: it cannot serve, and versions or run settings the trainer's key did not sign.
REFUSALS = (
    "another base",
    "no LoRA support",
    "rank above max",
    "bad targets",
    "too many versions",
    "mode switch",
    "adapter failed",
    "bad adapter",
    "untrusted version",
    "untrusted run settings",
)


class LimitExceededError(RolloutError, ValueError):
    """A request asked for more than the server's caps (prompts per batch, tokens, games); nothing ran.

    Attributes:
        limit: Name of the cap (`max_batch`, `max_tokens`, `max_games`).
        value: What the request asked for.
        cap: The server's cap.
    """

    def __init__(self, limit: str, value: int, cap: int, flag: str) -> None:
        super().__init__(
            f"{limit} {value} is over this server's cap of {cap}: split the request, or start the "
            f"server with a higher {flag}"
        )
        self.limit = limit
        self.value = value
        self.cap = cap
