"""``app.py``: the role dispatch. Starting a role for real is covered by test_env_server.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ._env_server import REPO


def run_app(*args: str, role: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPACE_ROLE"}
    if role is not None:
        env["SPACE_ROLE"] = role
    return subprocess.run(
        [sys.executable, "app.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("args", "role", "error"),
    [
        ((), None, "no role given: name one, or set SPACE_ROLE; available roles: env"),
        (("trainer",), None, "argument role: invalid choice: 'trainer' (choose from 'env')"),
        ((), "rollout", "argument role: invalid choice: 'rollout' (choose from 'env')"),
        (("env", "--max-sessions", "0"), None, "max_sessions must be >= 1, got 0"),
        (("env", "--session-ttl", "-1"), None, "idle_timeout_s must be > 0 seconds, got -1.0"),
    ],
)
def test_bad_invocations_name_the_problem(args: tuple[str, ...], role: str | None, error: str) -> None:
    result = run_app(*args, role=role)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"app.py: error: {error}"


def test_help_lists_the_roles() -> None:
    result = run_app("--help")
    assert result.returncode == 0 and "{env}" in result.stdout
