"""``python app.py`` with no role, in parts: how it words an app's end, the tokens and keys each app gets, the ports
and the GPU share of its rollout servers, the order it starts them in, and the kept tokens' file. The launcher run
whole (its apps as processes: a killed server, Ctrl-C, a resuming second start) is tests/test_product_browser.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from delta.errors import PrivateFileError
from launcher.children import Ended, exit_text
from launcher.config import REPO, LauncherConfig
from launcher.launch import build_children, start_together
from models.hardware import Gpu, Machine, rollout_share_beside_trainer
from launcher.tokens import KeptTokens, launch_tokens


def test_exit_text_tells_a_clean_stop_a_kill_after_the_timeout_and_a_signal_from_elsewhere() -> None:
    assert exit_text(Ended(0, seconds=2.14)) == "stopped in 2.1 s (exit status 0)"
    assert exit_text(Ended(-signal.SIGTERM, seconds=0.3)) == "stopped in 0.3 s (by SIGTERM)"
    assert exit_text(Ended(-signal.SIGKILL, forced=True, seconds=30.0)) == (
        "killed by the launcher: it did not stop within 30.0 s")
    assert exit_text(Ended(-signal.SIGKILL)) == "killed by signal 9 (SIGKILL), not by the launcher"
    assert exit_text(Ended(3)) == "exited with status 3"
    assert exit_text(None) == "never started"


def test_each_app_gets_the_tokens_it_checks_or_sends_in_its_environment() -> None:
    env, rollout, trainer = build_children(LauncherConfig(), "/models/tiny", "owner", launch_tokens({}))
    assert env.environ["ENV_TOKEN"] == rollout.environ["ENV_TOKEN"]
    assert rollout.environ["ROLLOUT_TOKEN"] == trainer.environ["ROLLOUT_TOKEN"] != env.environ["ENV_TOKEN"]
    assert set(env.environ) == {"ENV_TOKEN"} and set(trainer.environ) == {"OWNER_TOKEN", "ROLLOUT_TOKEN"}
    assert not any(v in " ".join(c.args) for c in (env, rollout, trainer) for v in rollout.environ.values())
    assert launch_tokens({})["ENV_TOKEN"] != env.environ["ENV_TOKEN"]  # fresh for every start...


def test_the_rollout_servers_get_the_trainers_public_key_and_the_trainer_finds_its_own(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """As the tokens: the rollout servers check the weights and run settings with the trainer's public key, passed
    in their environment; the trainer signs with the key kept for the bucket, which the launcher made, never passed."""
    from delta.signing import trainer_key
    from delta.storage import open_storage
    from launcher.launch import trainer_public_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bucket = str(tmp_path / "bucket")
    key = trainer_public_key(bucket)
    assert trainer_public_key(bucket) == key == trainer_key(open_storage(bucket).url).public  # made once, kept
    env, rollout, trainer = build_children(LauncherConfig(bucket=bucket), "/models/tiny", "owner", launch_tokens({}),
                                           trusted_key=key.text)
    assert rollout.environ["DELTA_TRUSTED_KEY"] == key.text
    assert "DELTA_TRUSTED_KEY" not in trainer.environ and "DELTA_SIGNING_KEY" not in trainer.environ
    assert not any(key.text in " ".join(c.args) for c in (env, rollout, trainer))


def test_tokens_set_beforehand_are_kept() -> None:
    """...unless the person set them: a script of theirs keeps calling the rollout across restarts."""
    tokens = launch_tokens({"ROLLOUT_TOKEN": "mine", "ENV_TOKEN": ""})
    assert tokens["ROLLOUT_TOKEN"] == "mine" and len(tokens["ENV_TOKEN"]) >= 24


def test_the_launcher_keeps_its_tokens_per_bucket_in_an_owner_only_file(tmp_path: Path) -> None:
    """A second start on the same bucket gets the same tokens (its exam records still verify), another bucket its
    own; the file is 0600 in a 0700 folder, outside the bucket; an explicit token wins and is never written."""
    keys = tmp_path / "keys"
    first = launch_tokens({}, KeptTokens(str(keys), "/data/bucket"))
    assert launch_tokens({}, KeptTokens(str(keys), "/data/bucket")) == first
    assert launch_tokens({}, KeptTokens(str(keys), "/data/other"))["ROLLOUT_TOKEN"] != first["ROLLOUT_TOKEN"]
    kept = KeptTokens(str(keys), "/data/bucket")
    assert kept.path.parent == keys and oct(kept.path.stat().st_mode & 0o777) == "0o600"
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    assert kept.read() == first and set(first) == {"ENV_TOKEN", "ROLLOUT_TOKEN", "OWNER_TOKEN"}
    mine = launch_tokens({"ROLLOUT_TOKEN": "explicit-token-of-mine"}, kept, owner_token="owner-of-mine-1234567")
    assert mine == {**first, "ROLLOUT_TOKEN": "explicit-token-of-mine", "OWNER_TOKEN": "owner-of-mine-1234567"}
    assert "explicit" not in kept.path.read_text() and "owner-of-mine" not in kept.path.read_text()
    assert launch_tokens({}, kept) == first  # the explicit token gone, the kept one again


def test_a_kept_tokens_file_others_can_read_is_tightened_and_a_damaged_one_replaced(tmp_path: Path) -> None:
    kept = KeptTokens(str(tmp_path), "s3://b/run")
    first = launch_tokens({}, kept)
    kept.path.chmod(0o644)
    assert launch_tokens({}, kept) == first and oct(kept.path.stat().st_mode & 0o777) == "0o600"
    kept.path.write_text("{not json")
    fresh = launch_tokens({}, kept)
    assert fresh["ROLLOUT_TOKEN"] != first["ROLLOUT_TOKEN"] and kept.read() == fresh


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


def test_without_a_gpu_the_apps_start_at_once_and_beside_vllm_on_a_gpu_one_after_the_other() -> None:
    """On CPUs each app loads its model while the others do (the first step comes sooner); vLLM sizes its share of
    a GPU from the memory free when it starts, so there each app waits for the previous one."""
    l4 = Gpu("NVIDIA L4", (8, 9), True, 22 << 30, 22 << 30)
    assert start_together(LauncherConfig(engine="transformers"), None)
    assert start_together(LauncherConfig(), Machine(()))
    assert not start_together(LauncherConfig(), Machine((l4,)))
    assert not start_together(LauncherConfig(engine="vllm"), Machine((l4,)))


@pytest.mark.parametrize("plant", ["symlink", "fifo", "folder"])
def test_a_link_fifo_or_folder_in_place_of_the_kept_tokens_is_refused_in_one_line(tmp_path: Path, plant: str) -> None:
    """Never followed (a planted target's tokens are not used, its mode not changed), never waited on, never a
    traceback: the launcher says which file, and stops."""
    kept = KeptTokens(str(tmp_path / "keys"), "/data/bucket")
    kept.path.parent.mkdir(mode=0o700)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"bucket": "/data/bucket", "ROLLOUT_TOKEN": "planted-token-0123456789"}))
    planted.chmod(0o644)
    {"symlink": lambda: kept.path.symlink_to(planted), "fifo": lambda: os.mkfifo(kept.path),
     "folder": lambda: kept.path.mkdir()}[plant]()
    with pytest.raises(PrivateFileError, match="refused") as refused:
        launch_tokens({}, kept)
    assert "\n" not in str(refused.value) and str(kept.path) in str(refused.value)
    assert oct(planted.stat().st_mode & 0o777) == "0o644"
    launcher = subprocess.run([sys.executable, "app.py", "--keys", str(kept.path.parent), "--bucket", "/data/bucket"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert launcher.returncode == 1
    assert f"[app] cannot use the kept tokens: {kept.path}:" in launcher.stdout and "Traceback" not in launcher.stderr
