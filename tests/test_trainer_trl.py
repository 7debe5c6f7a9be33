"""trainer_space._trl: TRL without its warning about the vLLM version pinned here for the rollout."""

from __future__ import annotations

import subprocess
import sys

from tests._env_server import REPO


def test_the_trainer_imports_trl_without_the_vllm_version_warning() -> None:
    """The trainer's log, where a newcomer is pointed, carried TRL's "supports vLLM versions from ... to ..." four
    times at start; the trainer never runs TRL's vLLM. Every warning is shown here (-W default): that one is not."""
    code = "from trainer_space.offpolicy import OffPolicyGRPOTrainer; from trainer_space._trl import GRPOConfig"
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "TRL currently supports vLLM versions" not in done.stderr
