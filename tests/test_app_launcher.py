"""``python app.py`` with no role: the apps as processes, a landing page, clean stops, a resuming restart, and
a fleet that outlives one of its rollout servers.

Real processes on loopback ports, a tiny model, a temporary bucket. The first start is stopped with
SIGINT (what Ctrl-C sends; SIGTERM takes the same path, see test_product_browser.py) while the apps work
and every UI has a page open; each app must exit cleanly within `settings.STOP_WITHIN_S`, leaving logs
without a traceback. The second start continues the history; its launcher is SIGKILLed and its apps must
still go away (the kernel's parent-death signal).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

import settings
from delta import PrivateFileError
from launcher.children import Ended, exit_text
from launcher.config import REPO, LauncherConfig
from launcher.launch import build_children, start_together
from models.hardware import Gpu, Machine, rollout_share_beside_trainer
from launcher.tokens import KeptTokens, launch_tokens
from wire.exam_shelf import ExamShelf
from wire.fleet import fleet_key
from tests._launcher import alive, start_launcher
from tests._trainer_stack import tiny_model, wait_until


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


#: What a clean stop leaves in no app's log: a traceback, a C++ abort, uvicorn cancelling requests, a line per
#: HTTP request.
NOT_IN_A_CLEAN_LOG = ("Traceback", "terminate called", "signal 6", "Aborted", "timeout graceful shutdown exceeded",
                      "CancelledError", "httpx: HTTP Request")


@contextmanager
def pages_open(urls: list[str]) -> Iterator[None]:
    """Hold each UI's session heartbeat open, as a browser tab on the page does, until the block ends."""
    def hold(url: str) -> None:
        try:
            with httpx.stream("GET", f"{url}/gradio_api/heartbeat/test-{url.rsplit(':', 1)[1]}", timeout=None) as r:
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:  # the server went away: what a closing tab sees
            pass

    holders = [threading.Thread(target=hold, args=(u,), daemon=True) for u in urls]
    for t in holders:
        t.start()
    time.sleep(1.0)
    yield
    for t in holders:
        t.join(30)


def assert_clean_stop(output: str, logs: Path, apps: list[str]) -> None:
    """Every app stopped by itself within the promise, exit status 0, and its log holds nothing of a messy stop."""
    for app in apps:
        stopped = re.search(rf"\[app\] {app} stopped in ([\d.]+) s \(exit status 0\)", output)
        assert stopped, f"{app} did not stop cleanly:\n{output}"
        assert float(stopped.group(1)) < settings.STOP_WITHIN_S, output
        log = (logs / f"{app}.log").read_text(errors="replace")
        assert [bad for bad in NOT_IN_A_CLEAN_LOG if bad in log] == [], f"{app}.log:\n{log[-3000:]}"
    assert f"stopping all {len(apps)} apps" in output


def test_all_three_start_ctrl_c_stops_them_and_a_second_start_resumes(model: str, tmp_path: Path) -> None:
    bucket, logs = tmp_path / "bucket", tmp_path / "logs"
    first = start_launcher(model, bucket, logs, tmp_path / "first.out")
    try:
        first.wait_ready(300)
        def states() -> list[tuple[str, str]]:
            return [(c["role"], c["state"]) for c in httpx.get(f"{first.url('landing')}/api/status", timeout=10).json()["apps"]]

        # (a card reads "not answering" while its app is too busy to answer within a second: loading a model on a
        # loaded machine, say)
        wait_until(lambda: states() == [("env", "ready"), ("rollout", "ready"), ("trainer", "ready")], 60,
                   f"every card ready, not {states()}")
        assert "delta-sync" in httpx.get(first.url("landing"), timeout=10).text
        for app in ("env", "rollout", "trainer"):
            assert httpx.get(f"{first.url(app)}/health", timeout=10).status_code == 200
        # The apps hold their tokens: the trainer's rollouts pass, an anonymous caller's are refused.
        assert httpx.post(f"{first.url('rollout')}/generate", json={"prompts": ["hi"]}, timeout=10).status_code == 401
        # Training runs and the rollout follows the bucket.
        wait_until(lambda: first.status("trainer")["version"] >= 2, 180, "two published versions")
        wait_until(lambda: first.status("rollout")["version"] >= 1, 60, "the rollout to apply a delta")
        # The untrained policy's exam, taken after the server's first batch (it never held the first step back), and
        # the next one (of the first version the server held in the block of 5 to 9: every 5 versions, and a server
        # may skip one while the trainer publishes fast): the two the restart must keep.
        first_exams = wait_until(lambda: (v := [e["version"] for e in first.status("trainer")["exams"]][:2])[:1] == [0]
                                 and len(v) == 2 and v, 240, "the exams of v0 and of the block of v5")
        assert 5 <= first_exams[1] < 10, first_exams
        pids = first.app_pids()
        assert len(pids) >= 3
        with pages_open([first.url(app) for app in ("env", "rollout", "trainer")]):
            assert first.status("trainer")["state"] == "running"  # mid-work: training, playing, serving
            began = time.monotonic()
            assert first.stop(signal.SIGINT) == 0
            took = time.monotonic() - began
    finally:
        if first.proc.poll() is None:
            first.kill()
    output = first.output()
    assert "stopping trainer, rollout, env" in output and "all stopped" in output and "rollout token" in output
    assert_clean_stop(output, logs, ["env", "rollout", "trainer"])
    assert took < settings.STOP_WITHIN_S + 2, f"the launcher took {took:.1f} s to exit"  # + its own start and end
    assert alive(pids) == set(), f"processes left after Ctrl-C: {alive(pids)}"
    first_steps = httpx_history_steps(bucket)
    assert first_steps, "the first run's history was not kept in the bucket"

    second = start_launcher(model, bucket, logs, tmp_path / "second.out")
    try:
        second.wait_ready(300)
        status = wait_until(lambda: (s := second.status("trainer"))["resumed_from"] is not None and s, 120,
                            "the trainer to resume")
        assert status["resumed_from"] >= 2
        resumed = status["resumed_from"]
        wait_until(lambda: second.status("trainer")["version"] > resumed, 120, "a version after the resumed one")
        # The restarted trainer shows the earlier versions' points and goes on counting steps from them.
        history = httpx.get(f"{second.url('trainer')}/history", timeout=10).json()
        steps = [(r["step"], r["version"]) for r in history["steps"]]
        earlier = [(s, v) for s, v in first_steps if v <= resumed]
        assert steps[:len(earlier)] == earlier and len(steps) > len(earlier)
        assert [s for s, _ in steps] == list(range(1, len(steps) + 1))  # one count across both processes
        assert second.status("trainer")["step"] >= earlier[-1][0]
        assert [a["version"] for a in history["anchors"]][:1] == [1]  # the first version's full copy, still shown
        # The launcher kept its tokens: the exams signed before the restart still verify, every one is shown, and
        # no page calls a file of the run "forged".
        key = fleet_key(KeptTokens(str(tmp_path / "keys"), str(bucket)).read()["ROLLOUT_TOKEN"])
        in_bucket = [r.model_dump(mode="json") for r in ExamShelf(str(bucket), key).records()]
        assert [r["version"] for r in in_bucket][:2] == first_exams and history["exams"] == in_bucket
        status = second.status("trainer")
        assert status["exams_refused"] == {} and [e["version"] for e in status["exams"]][:2] == first_exams
        wait_until(lambda: all(s["state"] in ("producing", "full") for s in second.status("trainer")["fleet"]), 60,
                   "the server producing again")
        shown = str(second.status("trainer")["fleet"]) + str(second.status("rollout"))
        assert "forged" not in shown and "signature" not in shown, shown
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


def httpx_history_steps(bucket: Path) -> list[tuple[int, int]]:
    """(step, version) of every step record in the bucket's history file (what the next trainer reads)."""
    from wire.history import HISTORY_PATH, decode_history

    return [(r.step, r.version) for r in decode_history((bucket / HISTORY_PATH).read_bytes()).history.steps]


def test_exit_text_tells_a_clean_stop_a_kill_after_the_timeout_and_a_signal_from_elsewhere() -> None:
    assert exit_text(Ended(0, seconds=2.14)) == "stopped in 2.1 s (exit status 0)"
    assert exit_text(Ended(-signal.SIGTERM, seconds=0.3)) == "stopped in 0.3 s (by SIGTERM)"
    assert exit_text(Ended(-signal.SIGKILL, forced=True, seconds=30.0)) == (
        "killed by the launcher: it did not stop within 30.0 s")
    assert exit_text(Ended(-signal.SIGKILL)) == "killed by signal 9 (SIGKILL), not by the launcher"
    assert exit_text(Ended(3)) == "exited with status 3"
    assert exit_text(None) == "never started"


def test_a_fleet_outlives_a_killed_rollout_server(model: str, tmp_path: Path) -> None:
    """SIGKILL one of two rollout servers: the launcher says so and restarts it, the trainer keeps publishing,
    the landing page shows the restart; Ctrl-C then stops all four cleanly."""
    bucket, logs = tmp_path / "bucket", tmp_path / "logs"
    launch = start_launcher(model, bucket, logs, tmp_path / "launcher.out", "--rollouts", "2")
    try:
        launch.wait_ready(400)
        wait_until(lambda: launch.status("trainer")["version"] >= 1, 240, "a first published version")
        os.kill(launch.app_pid("rollout-2"), signal.SIGKILL)
        killed_at = launch.status("trainer")["version"]
        wait_until(lambda: "rollout-2 killed by signal 9 (SIGKILL), not by the launcher" in launch.output(), 30,
                   "the launcher to say what happened to rollout-2")
        wait_until(lambda: launch.status("trainer")["version"] >= killed_at + 2, 300,
                   "two more versions with one rollout server gone")
        wait_until(lambda: "rollout-2 is back (restart 1)" in launch.output(), 300, "rollout-2 to restart")
        cards = {c["name"]: c for c in httpx.get(f"{launch.url('landing')}/api/status", timeout=10).json()["apps"]}
        assert cards["rollout-2"]["state"] == "ready" and ["restarts", "1 (last exit: killed by signal 9 (SIGKILL), "
                                                                       "not by the launcher)"] in cards["rollout-2"]["fields"]
        assert launch.stop(signal.SIGINT) == 0
    finally:
        if launch.proc.poll() is None:
            launch.kill()
    assert_clean_stop(launch.output(), logs, ["env", "rollout", "rollout-2", "trainer"])
    # One examiner per version: the servers never both play the same version's exam.
    examined = [int(v) for name in ("rollout", "rollout-2")
                for v in re.findall(r"exam of v(\d+):", (logs / f"{name}.log").read_text(errors="replace"))]
    assert examined and len(examined) == len(set(examined)), examined


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
    from delta import open_storage, trainer_key
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
