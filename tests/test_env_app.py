"""``python app.py env``: the env role's flags. Starting it for real is covered by test_env_server.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ._env_server import REPO


def run_app(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPACE_ROLE"}
    return subprocess.run(
        [sys.executable, "app.py", *args], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--max-sessions", "0"), "argument --max-sessions: must be >= 1, got 0"),
        (("--session-ttl", "-1"), "argument --session-ttl: must be > 0 seconds, got -1.0"),
        (("--port", "x"), "argument --port: invalid int value: 'x'"),
    ],
)
def test_bad_env_flags_name_the_flag(args: tuple[str, ...], error: str) -> None:
    result = run_app("env", *args)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"app.py env: error: {error}"


def test_env_help_lists_its_flags() -> None:
    result = run_app("env", "--help")
    assert result.returncode == 0
    for flag in ("--host", "--port", "--max-sessions", "--session-ttl"):
        assert flag in result.stdout
