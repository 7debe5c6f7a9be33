"""Errors of the Wordle environment. The HTTP layer maps each class to one status code."""

from __future__ import annotations


class WordleError(Exception):
    """Base class of every error this package raises on purpose."""


class ServerFullError(WordleError):
    """No free session slot: the server already runs its maximum number of games.

    Attributes:
        retry_after: Seconds until the idlest game expires and frees a slot (HTTP ``Retry-After``).
    """

    def __init__(self, active: int, limit: int, retry_after: int = 1) -> None:
        self.active = active
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(
            f"server full: {active} of {limit} game sessions are in use; finish or close a game, "
            "or retry when an idle session expires"
        )


class SessionNotFoundError(WordleError, LookupError):
    """No live session with this id: it never existed, its game ended, or it expired while idle."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        super().__init__(
            f"no live game session {episode_id!r}: it finished, expired while idle, or never "
            "existed; start a new one with reset"
        )


class SessionExistsError(WordleError):
    """A client asked for an episode id that a live session already uses."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        super().__init__(f"episode id {episode_id!r} is already in use by a live game; pick another")


class InvalidSecretError(WordleError, ValueError):
    """A client chose a secret that is not an allowed word."""

    def __init__(self, secret: str, reason: str) -> None:
        self.secret = secret
        super().__init__(f"invalid secret: {reason}")


class GameOverError(WordleError):
    """A move was sent to a game that has already ended."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        super().__init__(f"game {episode_id!r} is over; start a new one with reset")


class ClientLimitError(WordleError):
    """One client (by address) already runs as many live games as an anonymous visitor may.

    Attributes:
        retry_after: Seconds until that client's idlest game expires (HTTP ``Retry-After``).
    """

    def __init__(self, active: int, limit: int, retry_after: int) -> None:
        self.active = active
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(
            f"too many live games from your address: {active} of {limit}; finish or close one (POST /close), "
            f"or retry in {retry_after} s when an idle one expires"
        )


class ForbiddenError(WordleError, PermissionError):
    """An anonymous client asked for what only the env token allows (a policy's weight version)."""
