"""The fleet with real processes: an env, rollout servers and a trainer that share nothing but a bucket (a
folder, and S3 through `rclone serve s3`). No trainer flag names a rollout server.

The long test goes through a run as an operator would see it: two servers produce, one is killed with
SIGKILL mid-run and a third joins late; a torn file, a file from another run and a group older than the
staleness bound are dropped into the bucket; the run is paused (nothing produced, nothing published) and
stopped. Then every group any server logged as written is accounted for exactly once: trained on, dropped
as stale, or still waiting in the bucket; no group was trained on twice; every step's games were within
the staleness bound and every step has its importance weights. Another hands the exams over from a server keeping
version 0 for its exam to one with a lower id that joins.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests._env_server import running_app, running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, wait_until
from tests.test_wire_fleet import game, group
from wire.fleet import GameGroup, ServerState, encode, group_path
from wire.fleet_bucket import FleetBucket
from wire.liveness import HeartbeatWatch
from wire.trajectory import Trajectory

ROLLOUT_FLAGS = ("--engine", "transformers", "--poll-interval", "0.2", "--showcase-every", "0")


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def history(url: str) -> dict:
    return httpx.get(f"{url}/history", timeout=10).json()


def written_groups(*logs: str) -> list[str]:
    """The groups the rollout servers logged as committed."""
    return [m for log in logs for m in re.findall(r"wrote group (fleet/groups/\S+\.json)", log)]


def test_a_fleet_survives_a_killed_server_a_late_one_bad_files_and_a_pause(tmp_path: Path) -> None:
    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    fleet_bucket = FleetBucket(bucket)
    shared = ("--bucket", bucket, "--model", model)
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))

        def rollout(name: str):
            return stack.enter_context(running_app("rollout", *shared, "--env-url", env, "--server-id", name,
                                                   *ROLLOUT_FLAGS, log=tmp_path / f"{name}.log"))

        a, b = rollout("a"), rollout("b")
        trainer = stack.enter_context(running_app(
            "trainer", *shared, "--env-url", env, "--max-steps", "1000", "--owner-token", "owner",
            "--max-staleness", "1", *FAST_TRAINING, log=tmp_path / "trainer.log"))
        t = trainer.url

        def fleet() -> dict[str, dict]:
            return {s["id"]: s for s in status(t)["fleet"]}

        # both servers produce; steps consume from both
        wait_until(lambda: status(t)["step"] >= 3, 240, "three steps")
        wait_until(lambda: {x["state"] for x in fleet().values()} <= {"producing", "full"} and len(fleet()) == 2, 30,
                   "both servers in the fleet table")
        assert status(t)["mode"] == "fleet" and status(t)["rollout_url"] is None
        run_id = status(t)["run_id"]

        # SIGKILL one server while it plays; the trainer goes on with the other
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        killed_at = status(t)["step"]
        wait_until(lambda: status(t)["step"] >= killed_at + 3, 240, "three steps after the kill")

        # bad files: torn, another run's, and a group older than the bound (version 0)
        fleet_bucket.storage.write(group_path(run_id, "crafted", "b00t", 0), encode(group(run=run_id))[:200])
        fleet_bucket.write_group(group(run="19990101-000000-deadbeef", seq=1))
        stale = group(run=run_id, seq=2, version=0).model_copy(  # the run's shape: replies of its 2 tokens at most
            update={"server_id": "crafted", "games": [game(0, tokens=2), game(0, tokens=2)]})
        fleet_bucket.write_group(stale)
        wait_until(lambda: status(t)["staleness"]["refused"] >= 2 and status(t)["staleness"]["dropped"] >= 2, 120,
                   "the bad files refused and the stale group dropped")

        # a server that joins late is used
        c = rollout("c")
        wait_until(lambda: any(p.split(".")[1] == "c" for s in history(t)["steps"] for p in s["groups"]),
                   240, "a step trained on the late server's games")
        assert wait_until(lambda: fleet().get("b", {}).get("state") == "gone", 60, "the killed server shown as gone")

        # paused: the servers stop producing and the trainer publishes nothing
        assert httpx.post(f"{t}/control", json={"action": "pause", "token": "owner"}).status_code == 200
        wait_until(lambda: status(t)["state"] == "paused", 120, "the trainer to pause at a step end")
        wait_until(lambda: all(status(u)["fleet_state"] == "paused" for u in (a.url, c.url)), 30, "servers paused")
        time.sleep(2)  # a batch that was in flight at the pause is written by now
        before = ([status(u)["groups_written"] for u in (a.url, c.url)], status(t)["version"])
        time.sleep(5)
        assert ([status(u)["groups_written"] for u in (a.url, c.url)], status(t)["version"]) == before

        # stop everything: the trainer first, then the servers, and account for every group
        assert httpx.post(f"{t}/control", json={"action": "stop", "token": "owner"}).status_code == 200
        wait_until(lambda: status(t)["state"] == "stopped", 60, "the trainer to stop")
        steps = history(t)["steps"]
        for app in (a, c):
            app.proc.terminate()
            app.proc.wait(30)
        trainer_log = trainer.output()
        logs = [x.output() for x in (a, b, c)]

    written = written_groups(*logs)
    trained = [p for s in steps for p in s["groups"]]
    dropped = re.findall(r"dropped group (fleet/groups/\S+\.json)", trainer_log)
    left = [f.path for f in fleet_bucket.list_groups()]
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    accounted = set(trained) | (set(dropped) - {stale.path}) | set(left)
    assert set(written) <= accounted, f"committed groups lost: {sorted(set(written) - accounted)}"
    # only the killed server may have committed a group and died before it logged it
    assert all(p.split(".")[1] == "b" for p in accounted - set(written)) and len(accounted - set(written)) <= 1
    assert not set(trained) & (set(dropped) | set(left))
    assert stale.path in dropped and stale.path not in trained
    assert all(not p.split("/")[-1].startswith("19990101") for p in trained)
    assert {p.split(".")[1] for p in trained} == {"a", "b", "c"}
    for s in steps:
        assert all(int(k) <= 1 for k in s["staleness"]), s
        assert s["ratio_mean"] is not None and 0 < s["ratio_min"] <= s["ratio_mean"] <= s["ratio_max"] <= 3.0, s
        assert len(s["groups"]) == 4 and sum(s["staleness"].values()) == 8


def test_a_server_keeping_v0_for_its_exam_lets_it_go_when_a_lower_id_joins(tmp_path: Path) -> None:
    """Issue 56: server "b" keeps version 0 for the exam of v0, which waits for the trainer's first step; the trainer
    is held before that step (SIGSTOP while it waits for groups: nothing is published, whatever the machine's load).
    Server "a" joins and examines from then on (the lowest id): "b" lets v0 go at its next look. Once the trainer goes
    on, "b" follows its versions and its groups are trained ("b" used to serve v0 for good, and from the trainer's
    third version on every group of it was dropped as too stale: 76 in one run)."""
    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    fleet_bucket = FleetBucket(bucket)
    shared = ("--bucket", bucket, "--model", model)
    kept, let_go = "v0 is kept for it meanwhile", "v0, kept for its exam, let go"  # rollout_space.exam's log lines
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        trainer = stack.enter_context(running_app(  # exams every 5 versions and of v0; staleness bound 2
            "trainer", *shared, "--env-url", env, "--max-steps", "1000", *FAST_TRAINING, log=tmp_path / "trainer.log"))
        t = trainer.url
        wait_until(lambda: status(t)["waiting_for_rollouts"], 120, "the trainer's first step waiting for groups")
        run = fleet_bucket.read_run()
        trainer.proc.send_signal(signal.SIGSTOP)
        stack.callback(trainer.proc.send_signal, signal.SIGCONT)  # before the trainer is stopped, on any way out

        def rollout(name: str):
            return stack.enter_context(running_app("rollout", *shared, "--env-url", env, "--server-id", name,
                                                   *ROLLOUT_FLAGS, log=tmp_path / f"{name}.log"))

        b = rollout("b")
        wait_until(lambda: kept in b.output(), 120, '"b" keeping v0 for its exam')  # its first batch fills the room
        a = rollout("a")
        watch = HeartbeatWatch(fleet_bucket)
        wait_until(lambda: any(s.heartbeat.server_id == "a" and s.heartbeat.run_id == run.run_id
                               and s.heartbeat.state == ServerState.FULL for s in watch.read()), 60,
                   '"a" working for the run')
        joined = time.monotonic()
        wait_until(lambda: let_go in b.output(), 30, '"b" letting v0 go')  # a look every 0.2 s
        let_go_s = time.monotonic() - joined
        assert let_go_s < 10, f'"b" let v0 go {let_go_s:.1f} s after "a" joined'  # not "never"; load stretches a poll
        assert status(b.url)["version"] == 0  # nothing published: let go, not examined and moved on
        trainer.proc.send_signal(signal.SIGCONT)

        wait_until(lambda: status(t)["step"] >= 8, 300, "eight steps")  # v0 is 3 versions behind from step 4 on
        final, steps = status(t), history(t)["steps"]
        assert status(b.url)["version"] >= 1, "b still serves v0"
        b_log, trainer_log = b.output(), trainer.output()
    wrote = r"wrote group (fleet/groups/\S+\.json) \(\d+ games, version (\d+)\)"
    played = {path: int(version) for path, version in re.findall(wrote, b_log)}  # b's groups: their versions
    trained = {p for s in steps for p in s["groups"]}
    followed = {p for p, v in played.items() if v >= 1} & trained  # none while b kept v0: from step 4 on all dropped
    dropped = [p for p in re.findall(r"dropped group (fleet/groups/\S+\.json)", trainer_log) if p in played]
    assert len(followed) >= 3, (f"b's groups of versions >= 1 trained: {sorted(followed)}; b's groups dropped as "
                                f"stale: {dropped}; the trainer's dropped games: {final['staleness']['dropped']}")


@pytest.mark.parametrize("where", ["s3"])
def test_a_fleet_trains_through_s3(tmp_path: Path, rclone_s3, where: str) -> None:
    model = tiny_model(str(tmp_path / "model"))
    bucket = "s3://fleet-run/demo"
    with running_server("env") as env, \
            running_app("rollout", "--bucket", bucket, "--model", model, "--env-url", env, "--server-id", "s3-server",
                        *ROLLOUT_FLAGS, env=rclone_s3.env()) as rollout, \
            running_app("trainer", "--bucket", bucket, "--model", model, "--env-url", env, "--max-steps", "3",
                        *FAST_TRAINING, env=rclone_s3.env()) as trainer:
        final = wait_until(lambda: (s := status(trainer.url))["state"] == "stopped" and s["step"] == 3 and s, 300,
                           "three steps through S3")
        assert final["error"] is None and final["version"] >= 1
        assert [s["id"] for s in final["fleet"]] == ["s3-server"]
        steps = history(trainer.url)["steps"]
        assert all(s["groups"] and s["ratio_mean"] is not None for s in steps)
        # The server may still hold version 0 for its exam when the trainer stops (the exam of v0 waits for step 1
        # and plays after it); a stopped run lets v0 go, and the server then follows the bucket.
        wait_until(lambda: status(rollout.url)["version"] >= 1, 60, "the rollout to serve a published version")


def test_a_group_with_token_ids_beyond_the_vocabulary_is_refused_and_training_goes_on(tmp_path: Path) -> None:
    """Issue 37: one crafted group used to end the run (IndexError in the GRPO step). Here the run signs its files
    (the rollout token): a group signed with the token but holding a token id beyond the model's vocabulary, and a
    well-formed group written without the token, are both refused and counted by reason, and training goes on."""
    model, bucket, token = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket"), "fleet-secret"
    shared = ("--bucket", bucket, "--model", model)
    with running_server("env") as env, \
            running_app("rollout", *shared, "--env-url", env, "--server-id", "a", "--token", token, *ROLLOUT_FLAGS,
                        log=tmp_path / "a.log", timeout_s=300), \
            running_app("trainer", *shared, "--env-url", env, "--max-steps", "1000", "--rollout-token", token,
                        *FAST_TRAINING, log=tmp_path / "trainer.log", timeout_s=300) as trainer:
        t = trainer.url
        wait_until(lambda: status(t)["step"] >= 2, 240, "two steps")
        now = status(t)
        run = FleetBucket(bucket).read_run()  # read without the token: signed files stay readable
        assert now["signed"] and run.vocab_size and run.run_id == now["run_id"]
        version = now["trainer_version"]
        game = Trajectory(prompt_ids=[1, 2, run.vocab_size + 5], episode_id="crafted",
                          completion_ids=[3, 4, 5, 6, 7, 8], logprobs=[-0.5, -0.5, 0.0, 0.0, -0.5, -0.5], env_mask=[1, 1, 0, 0, 1, 1],
                          turn_rewards=[0.0, 0.0], versions=[version, version])
        crafted = GameGroup(run_id=run.run_id, server_id="crafted", boot="b00t", seq=0, seed=1, games=[game, game],
                            played_s=1.0, created_at=time.time())
        FleetBucket(bucket, secret=token).write_group(crafted)
        clean = game.model_copy(update={"prompt_ids": [1, 2, 3]})
        FleetBucket(bucket).write_group(crafted.model_copy(update={"seq": 1, "games": [clean, clean]}))  # no token
        wait_until(lambda: status(t)["groups_refused"].get("token id out of the vocabulary") == 1
                   and status(t)["groups_refused"].get("unsigned or forged") == 1, 120, "both groups refused")
        at = status(t)["step"]
        wait_until(lambda: status(t)["step"] >= at + 2, 240, "two more steps after the refusals")
        final = status(t)
        assert final["state"] == "running" and final["error"] is None, final
        steps = history(t)["steps"]
        assert not any(".crafted." in p for s in steps for p in s["groups"])
        log = trainer.output()
    assert "refused rollout group fleet/groups/" in log and "Traceback" not in log
