"""The secrets the three local apps share: the env's token (the rollout sends it) and the rollout's (the
trainer sends it). Made fresh for every start, handed to the children in their environment (never in
argv, where ``ps`` would show them to every local user)."""

from __future__ import annotations

import secrets

#: Which token variables each role reads: the env and the rollout check theirs; the rollout and the
#: trainer send the other side's.
ROLE_TOKENS = {"env": ("ENV_TOKEN",), "rollout": ("ENV_TOKEN", "ROLLOUT_TOKEN"), "trainer": ("ROLLOUT_TOKEN",)}


def new_tokens() -> dict[str, str]:
    """A fresh ENV_TOKEN and ROLLOUT_TOKEN."""
    return {"ENV_TOKEN": secrets.token_urlsafe(24), "ROLLOUT_TOKEN": secrets.token_urlsafe(24)}


def role_environ(role: str, tokens: dict[str, str]) -> dict[str, str]:
    """The token variables to set for ``role``'s process."""
    return {name: tokens[name] for name in ROLE_TOKENS[role]}
