"""`delta`'s own tests collect with `delta`'s dependencies and the test tools alone: on a GPU machine, or for a user
who installs the library without the apps, nothing of the web stack or of the apps is there to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The test files of the library alone (tests of the apps, and mixed ones such as test_fuzz, may import more).
DELTA_TESTS = ("anchors", "apply", "catchup", "checkpoints", "cli", "codec", "crafted", "device", "format", "foreign",
               "hashing", "layout", "manifest", "pieces", "publish", "retention", "storage", "subscribe", "whole")
#: What a machine with `delta` alone lacks: the web stack, the training stack and this repository's apps.
ABSENT = ("uvicorn", "httpx", "fastapi", "starlette", "gradio", "pydantic", "plotly", "trl", "transformers", "vllm",
          "wire", "dashboard", "env_space", "rollout_space", "trainer_space", "launcher", "webguard")


def test_the_library_s_tests_collect_without_the_web_stack_or_the_apps() -> None:
    code = (f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None  # import raises ImportError\n"
            "import pytest\nsys.exit(pytest.main(sys.argv[1:]))")
    files = [f"tests/test_{name}.py" for name in DELTA_TESTS]
    done = subprocess.run([sys.executable, "-c", code, "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " collected" in done.stdout and "error" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
