"""The secrets the three local apps share: the env's token (the rollout sends it) and the rollout's (the
trainer sends it). Taken from ENV_TOKEN / ROLLOUT_TOKEN when they are set (so a script of your own can
call the rollout across restarts), made fresh for every start otherwise, and handed to the children in
their environment (never in argv, where ``ps`` would show them to every local user)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import settings

#: Which token variables each role reads: the env and the rollout check theirs; the rollout and the
#: trainer send the other side's.
ROLE_TOKENS = {"env": ("ENV_TOKEN",), "rollout": ("ENV_TOKEN", "ROLLOUT_TOKEN"), "trainer": ("ROLLOUT_TOKEN",)}


def launch_tokens(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """ENV_TOKEN and ROLLOUT_TOKEN: each as set in `environ` (the process environment when None), or fresh."""
    return {s.variable: s.value(environ) or secrets.token_urlsafe(24)
            for s in (settings.ENV_TOKEN, settings.ROLLOUT_TOKEN)}


def role_environ(role: str, tokens: dict[str, str]) -> dict[str, str]:
    """The token variables to set for ``role``'s process."""
    return {name: tokens[name] for name in ROLE_TOKENS[role]}
