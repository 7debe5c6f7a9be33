"""``python app.py`` with no role: three apps as processes, a landing page, clean stops, a resuming restart.

Real processes on loopback ports, a tiny model, a temporary bucket. The first start is stopped with
SIGINT (what Ctrl-C sends; SIGTERM takes the same path, see test_product_browser.py); the second
launcher is SIGKILLed and its apps must still go away (the kernel's parent-death signal).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from launcher.children import exit_text
from launcher.config import LauncherConfig
from launcher.launch import build_children
from models.hardware import Gpu, Machine, rollout_share_beside_trainer
from launcher.tokens import launch_tokens
from tests._launcher import alive, start_launcher
from tests._trainer_stack import tiny_model, wait_until


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


def test_all_three_start_ctrl_c_stops_them_and_a_second_start_resumes(model: str, tmp_path: Path) -> None:
    bucket, logs = tmp_path / "bucket", tmp_path / "logs"
    first = start_launcher(model, bucket, logs, tmp_path / "first.out")
    try:
        first.wait_ready(300)
        cards = httpx.get(f"{first.url('landing')}/api/status", timeout=10).json()["apps"]
        assert [(c["role"], c["state"]) for c in cards] == [("env", "ready"), ("rollout", "ready"), ("trainer", "ready")]
        assert "delta-sync" in httpx.get(first.url("landing"), timeout=10).text
        for app in ("env", "rollout", "trainer"):
            assert httpx.get(f"{first.url(app)}/health", timeout=10).status_code == 200
        # The apps hold their tokens: the trainer's rollouts pass, an anonymous caller's are refused.
        assert httpx.post(f"{first.url('rollout')}/generate", json={"prompts": ["hi"]}, timeout=10).status_code == 401
        # Training runs and the rollout follows the bucket.
        wait_until(lambda: first.status("trainer")["version"] >= 2, 180, "two published versions")
        wait_until(lambda: first.status("rollout")["version"] >= 1, 60, "the rollout to apply a delta")
        pids = first.app_pids()
        assert len(pids) >= 3
        assert first.stop(signal.SIGINT) == 0
    finally:
        if first.proc.poll() is None:
            first.kill()
    output = first.output()
    assert "stopping trainer" in output and "all stopped" in output and "rollout token" in output
    assert "trainer stopped" in output and "exit status" not in output  # SIGTERM is a clean stop
    assert alive(pids) == set(), f"processes left after Ctrl-C: {alive(pids)}"
    for role in ("env", "rollout", "trainer"):
        assert (logs / f"{role}.log").stat().st_size > 0

    second = start_launcher(model, bucket, logs, tmp_path / "second.out")
    try:
        second.wait_ready(300)
        status = wait_until(lambda: (s := second.status("trainer"))["resumed_from"] is not None and s, 120,
                            "the trainer to resume")
        assert status["resumed_from"] >= 2
        resumed = status["resumed_from"]
        wait_until(lambda: second.status("trainer")["version"] > resumed, 120, "a version after the resumed one")
        # Killed with no chance to clean up: the kernel's parent-death signal must stop the apps.
        pids = second.app_pids()
        second.proc.kill()
        second.proc.wait()
        deadline = time.monotonic() + 60
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if second.proc.poll() is None:
            second.kill()
    assert alive(pids) == set(), f"apps outlived a SIGKILLed launcher: {alive(pids)}"


def test_exit_text_calls_the_launchers_own_sigterm_a_clean_stop() -> None:
    assert exit_text(-signal.SIGTERM) == exit_text(0) == "stopped"
    assert exit_text(-signal.SIGKILL) == "killed (it did not stop in time)"
    assert exit_text(3) == "stopped (exit status 3)"


def test_each_app_gets_the_tokens_it_checks_or_sends_in_its_environment() -> None:
    env, rollout, trainer = build_children(LauncherConfig(), "/models/tiny", "owner", launch_tokens({}))
    assert env.environ["ENV_TOKEN"] == rollout.environ["ENV_TOKEN"]
    assert rollout.environ["ROLLOUT_TOKEN"] == trainer.environ["ROLLOUT_TOKEN"] != env.environ["ENV_TOKEN"]
    assert set(env.environ) == {"ENV_TOKEN"} and set(trainer.environ) == {"OWNER_TOKEN", "ROLLOUT_TOKEN"}
    assert not any(v in " ".join(c.args) for c in (env, rollout, trainer) for v in rollout.environ.values())
    assert launch_tokens({})["ENV_TOKEN"] != env.environ["ENV_TOKEN"]  # fresh for every start...


def test_tokens_set_beforehand_are_kept() -> None:
    """...unless the person set them: a script of theirs keeps calling the rollout across restarts."""
    tokens = launch_tokens({"ROLLOUT_TOKEN": "mine", "ENV_TOKEN": ""})
    assert tokens["ROLLOUT_TOKEN"] == "mine" and len(tokens["ENV_TOKEN"]) >= 24


def test_n_rollout_servers_share_the_bucket_and_the_trainer_names_none() -> None:
    config = LauncherConfig(rollouts=3)
    children = build_children(config, "/models/tiny", "owner", launch_tokens({}))
    assert [(c.role, c.name, c.port) for c in children] == [
        ("env", "env", 7861), ("rollout", "rollout", 7862), ("rollout", "rollout-2", 7864),
        ("rollout", "rollout-3", 7865), ("trainer", "trainer", 7863)]
    trainer = children[-1]
    assert "--rollout-url" not in trainer.args and trainer.args[:2] == ["--bucket", config.bucket]
    assert [c.args[c.args.index("--server-id") + 1] for c in children[1:4]] == ["rollout", "rollout-2", "rollout-3"]
    assert all(c.args[c.args.index("--bucket") + 1] == config.bucket for c in children[1:])
    with pytest.raises(ValueError, match="--rollouts must be between 1 and 16, got 0"):
        LauncherConfig(rollouts=0)
    with pytest.raises(ValueError, match="the apps' ports must differ"):
        LauncherConfig(rollouts=2, port=7864)


def test_on_one_gpu_the_rollout_servers_leave_the_trainer_its_share() -> None:
    l4 = Gpu("NVIDIA L4", (8, 9), True, 22 << 30, 22 << 30)
    assert rollout_share_beside_trainer(Machine(()), 2) is None  # a CPU: nothing to split
    assert rollout_share_beside_trainer(Machine((l4,)), 1) == 0.5
    assert rollout_share_beside_trainer(Machine((l4,)), 2) == 0.25
    with pytest.raises(ValueError, match="16 vLLM rollout servers and the trainer do not fit one GPU"):
        rollout_share_beside_trainer(Machine((l4,)), 16)
    children = build_children(LauncherConfig(rollouts=2), "/models/tiny", "owner", launch_tokens({}), 0.25)
    shares = [c.args[c.args.index("--gpu-memory-utilization") + 1] for c in children if c.role == "rollout"]
    assert shares == ["0.25", "0.25"] and "--gpu-memory-utilization" not in children[-1].args
    mine = LauncherConfig(rollout_args=["--gpu-memory-utilization", "0.3"])  # the person's own share wins
    rollout = build_children(mine, "/models/tiny", "owner", launch_tokens({}), 0.5)[1]
    assert rollout.args.count("--gpu-memory-utilization") == 1 and rollout.args[-1] == "0.3"
