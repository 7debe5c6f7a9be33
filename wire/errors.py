"""The errors a client of the rollout Space raises, so its callers (the trainer) catch them without importing the
rollout app; the rollout Space's own errors subclass `RolloutError` (``rollout_space.errors``)."""

from __future__ import annotations


class RolloutError(RuntimeError):
    """Base class of the rollout Space's errors."""


class RolloutRefusedError(RolloutError):
    """The rollout server refused the request itself (a wrong or missing token, a request over its caps or
    malformed): sending it again cannot succeed, so callers do not retry it."""
