"""The fleet on a folder bucket, booted once: an env, rollout servers and a sequence of trainers as real processes that
share nothing but the bucket (no trainer flag names a rollout server in fleet mode), each phase a facet that a test of
its own used to boot the whole product for (tests/README.md maps them).

1. A held first step: server "b" keeps version 0 for the exam of v0 while the trainer is held (SIGSTOP) before its
   first step; "a", with a lower id, joins and examines from then on, and "b" lets v0 go and follows.
2. The first trainer's run: both servers produce, "b" is SIGKILLed mid-run, files crafted into the bucket (torn, another
   run's, a group older than the staleness bound, token ids beyond the vocabulary, an unsigned one) are refused or
   dropped, a third server joins late and is used, the run is paused (nothing produced, nothing published) and
   stopped; every group a server logged as written is accounted for exactly once, every step within the bound.
3. A trainer restarted with a new key, handing over from the old one: it resumes its own versions bit for bit (history,
   numbering, the next delta based on the last version), the servers follow it trusting the new key, and what a server
   serves is the bucket's version bit for bit (greedy logprobs equal those of an engine loaded here).
4. Two trainer ranks (torchrun, gloo) resume what one rank published, take every rank's groups, each publish a share.
5. One rank resumes what two published (an anchor of one file), in request mode against server "a", and rides out an
   env and a rollout that go away mid-training and come back; the owner's stop ends the wait between retries.
6. A stranger with write access publishes versions and run settings of its own: each server refuses them in one line,
   counts and shows them, keeps the trainer's, and takes the trainer's next version.
7. A trainer with a third key and no handover starts a run of its own: the servers refuse its settings, keep serving
   the trainer's last version, and that trainer's fleet table says they trust another key.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

import delta
from fleet.bucket import FleetBucket
from fleet.liveness import HeartbeatWatch
from rollout_space.engines import EngineConfig, SamplingParams, open_engine
from rollout_space.ui import status_markdown
from tests._env_server import App, free_port, running_app
from tests._stranger import copy_signature, publish_as_stranger
from tests._trainer_stack import FAST_TRAINING, tiny_model, torchrun_trainer, wait_until
from tests.test_wire_fleet import game, group
from wire.fleet import GameGroup, RunSettings, RunState, ServerState, encode, fleet_key, group_path
from wire.rollout import RolloutStatus
from wire.trainer import Payload, Staleness, StepRecord, TrainerStatus
from wire.trajectory import Trajectory

TOKENS = {"ENV_TOKEN": "env-secret", "ROLLOUT_TOKEN": "fleet-secret"}
OWNER = "owner-secret"
ROLLOUT_FLAGS = ("--engine", "transformers", "--poll-interval", "0.2", "--showcase-every", "0")
PROMPT = [5, 17, 99, 250, 3, 42, 7, 300]
#: What the trainer may see of a rollout that stops, each a documented answer (`rollout_space.engines.base`): the
#: request it was generating for answered 503 "closed while generating"; one that arrived once the close began,
#: 503 "is closed" (which comes first is a race between the request and the stop); then no answer at all.
STOPPING_ROLLOUT = ("did not answer /rollout", "the engine was closed while generating",
                    "the engine is closed; start a new one")


def status(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/status", timeout=10).json()


def history(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/history", timeout=10).json()


class Fleet:
    """The env and the rollout servers of the scenario, each restartable on its port, and the trainers' flags."""

    def __init__(self, root: Path, stack: contextlib.ExitStack) -> None:
        self.root, self.stack = root, stack
        self.model, self.bucket = tiny_model(str(root / "model")), str(root / "bucket")
        self.env_port = free_port()
        self.env_url = f"http://127.0.0.1:{self.env_port}"
        self.servers: dict[str, tuple[App, contextlib.ExitStack]] = {}
        self.env_up = contextlib.ExitStack()
        stack.callback(self.env_up.close)

    def start_env(self) -> None:
        self.env_up.enter_context(running_app("env", port=self.env_port, env={"ENV_TOKEN": TOKENS["ENV_TOKEN"]},
                                              log=self.root / "env.log"))

    def rollout(self, name: str, port: int | None = None) -> App:
        """Start server `name` (again, on `port`), trusting on first use with a cache of its own (kept across its
        restarts), with the fleet's tokens."""
        up = contextlib.ExitStack()
        self.stack.callback(up.close)
        app = up.enter_context(running_app(
            "rollout", "--bucket", self.bucket, "--model", self.model, "--env-url", self.env_url, "--server-id", name,
            *ROLLOUT_FLAGS, port=port, env={**TOKENS, "XDG_CACHE_HOME": str(self.root / f"cache-{name}")},
            log=self.root / f"{name}.log", timeout_s=300))
        self.servers[name] = (app, up)
        return app

    def url(self, name: str) -> str:
        return self.servers[name][0].url

    def trainer(self, log: str, *flags: str, key: delta.SigningKey, stack: contextlib.ExitStack | None = None,
                fleet: bool = True) -> App:
        """A `python app.py trainer` on the bucket signing with `key`, in `stack` (default the scenario's)."""
        env = {"ROLLOUT_TOKEN": TOKENS["ROLLOUT_TOKEN"], "OWNER_TOKEN": OWNER, "DELTA_SIGNING_KEY": key.secret_text()}
        mode = () if fleet else ("--rollout-url", self.url("a"))
        return (stack or self.stack).enter_context(running_app(
            "trainer", "--bucket", self.bucket, "--model", self.model, "--env-url", self.env_url, *mode, *flags,
            *FAST_TRAINING, env=env, log=self.root / log, timeout_s=300))


def test_a_fleet_through_a_held_step_a_killed_server_bad_files_a_pause_a_new_key_two_ranks_a_stranger_and_outages(
        tmp_path: Path) -> None:
    old, new, third = delta.SigningKey.generate(), delta.SigningKey.generate(), delta.SigningKey.generate()
    with contextlib.ExitStack() as stack:
        fleet = Fleet(tmp_path, stack)
        fleet.start_env()
        first = fleet.trainer("trainer-1.log", "--max-steps", "1000", "--max-staleness", "1", key=old,
                              stack=(first_up := contextlib.ExitStack()))
        stack.callback(first_up.close)
        check_a_server_keeping_v0_for_its_exam_lets_it_go_when_a_lower_id_joins(fleet, first)
        t1 = check_a_run_through_a_killed_server_bad_files_a_late_server_and_a_pause(fleet, first)
        first_up.close()
        t2 = check_a_trainer_with_a_new_key_resumes_hands_over_and_is_served_bit_for_bit(fleet, t1, old, new)
        t3 = check_two_ranks_resume_one_take_every_ranks_groups_and_publish_a_share_each(fleet, t2, new)
        t4 = check_one_rank_resumes_two_and_rides_out_an_env_and_a_rollout_outage(fleet, t3, new)
        check_the_servers_refuse_a_strangers_versions_and_settings_and_take_the_trainers_next(fleet, t3, t4, new)
        check_a_trainer_with_a_third_key_is_refused_and_told_the_servers_trust_another(fleet, new, third)


# --- 1. a held first step -------------------------------------------------------------------------------------------


def check_a_server_keeping_v0_for_its_exam_lets_it_go_when_a_lower_id_joins(fleet: Fleet, trainer: App) -> None:
    """Server "b" keeps version 0 for the exam of v0, which waits for the trainer's first step; the trainer is held
    before that step (SIGSTOP while it waits for groups: nothing is published, whatever the machine's load). Server
    "a" joins and examines from then on (the lowest id): "b" lets v0 go at its next look. Once the trainer goes on,
    "b" follows its versions and its groups are trained ("b" used to serve v0 for good, every group of it dropped as
    too stale from the trainer's third version on)."""
    kept, let_go = "v0 is kept for it meanwhile", "v0, kept for its exam, let go"  # rollout_space.exam's log lines
    wait_until(lambda: status(trainer.url)["waiting_for_rollouts"], 120, "the trainer's first step waiting for groups")
    run = FleetBucket(fleet.bucket).read_run()
    trainer.proc.send_signal(signal.SIGSTOP)
    try:
        b = fleet.rollout("b")
        wait_until(lambda: kept in b.output(), 120, '"b" keeping v0 for its exam')  # its first batch fills the room
        fleet.rollout("a")
        watch = HeartbeatWatch(FleetBucket(fleet.bucket))
        wait_until(lambda: any(s.heartbeat.server_id == "a" and s.heartbeat.run_id == run.run_id
                               and s.heartbeat.state == ServerState.FULL for s in watch.read()), 60,
                   '"a" working for the run')
        wait_until(lambda: let_go in b.output(), 60, '"b" letting v0 go')  # a look every 0.2 s
        assert status(b.url)["version"] == 0  # nothing published: let go, not examined and moved on
    finally:
        trainer.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: status(trainer.url)["step"] >= 8, 300, "eight steps")  # v0 is out of the bound by then
    assert status(b.url)["version"] >= 1, "b still serves v0"
    wrote = r"wrote group (fleet/groups/\S+\.json) \(\d+ games, version (\d+)\)"
    played = {path: int(version) for path, version in re.findall(wrote, b.output())}  # b's groups: their versions
    trained = {p for s in history(trainer.url)["steps"] for p in s["groups"]}
    followed = {p for p, v in played.items() if v >= 1} & trained  # none while b kept v0
    dropped = [p for p in re.findall(r"dropped group (fleet/groups/\S+\.json)", trainer.output()) if p in played]
    assert len(followed) >= 3, (f"b's groups of versions >= 1 trained: {sorted(followed)}; b's groups dropped as "
                                f"stale: {dropped}; the trainer's dropped games: {status(trainer.url)['staleness']}")


# --- 2. the first run -------------------------------------------------------------------------------------------------


def steady(read: Callable[[], Any], what: str) -> Any:
    """What `read()` gives once two reads a second apart agree (within 30 s)."""
    last = [read()]

    def settled() -> Any:
        time.sleep(1.0)
        now = read()
        if now == last[0]:
            return now
        last[0] = now
        return None

    return wait_until(settled, 30, what)


def written_groups(*logs: str) -> list[str]:
    """The groups the rollout servers logged as committed."""
    return [m for log in logs for m in re.findall(r"wrote group (fleet/groups/\S+\.json)", log)]


def check_a_run_through_a_killed_server_bad_files_a_late_server_and_a_pause(fleet: Fleet, trainer: App) -> dict:
    t = trainer.url
    b = fleet.servers["b"][0]

    def table() -> dict[str, dict]:
        return {s["id"]: s for s in status(t)["fleet"]}

    # both servers produce; steps consume from both
    wait_until(lambda: {x["state"] for x in table().values()} <= {"producing", "full"} and len(table()) == 2, 30,
               "both servers in the fleet table")
    now = status(t)
    assert now["mode"] == "fleet" and now["rollout_url"] is None and now["signed"]
    run = FleetBucket(fleet.bucket).read_run()  # read without the token: signed files stay readable
    assert run.run_id == now["run_id"] and run.vocab_size

    # SIGKILL one server while it plays; the trainer goes on with the other
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(10)
    killed_at = status(t)["step"]
    wait_until(lambda: status(t)["step"] >= killed_at + 3, 240, "three steps after the kill")

    # files crafted into the bucket: torn, another run's, a group older than the bound (version 0), token ids beyond
    # the vocabulary (each signed with the fleet's token), and a well-formed group without the token
    signed, unsigned = FleetBucket(fleet.bucket, secret=TOKENS["ROLLOUT_TOKEN"]), FleetBucket(fleet.bucket)
    signed.bucket.write(group_path(run.run_id, "crafted", "b00t", 0), encode(group(run=run.run_id))[:200])
    signed.write_group(group(run="19990101-000000-deadbeef", seq=1))
    stale = group(run=run.run_id, seq=2, version=0).model_copy(  # the run's shape: replies of its 2 tokens at most
        update={"server_id": "crafted", "games": [game(0, tokens=2), game(0, tokens=2)]})
    signed.write_group(stale)
    version = status(t)["trainer_version"]
    beyond = Trajectory(prompt_ids=[1, 2, run.vocab_size + 5], episode_id="crafted", completion_ids=[3, 4, 5, 6, 7, 8],
                        logprobs=[-0.5, -0.5, 0.0, 0.0, -0.5, -0.5], env_mask=[1, 1, 0, 0, 1, 1],
                        turn_rewards=[0.0, 0.0], versions=[version, version])
    crafted = GameGroup(run_id=run.run_id, server_id="crafted", boot="b00t", seq=3, seed=1, games=[beyond, beyond],
                        played_s=1.0, created_at=time.time())
    signed.write_group(crafted)
    clean = beyond.model_copy(update={"prompt_ids": [1, 2, 3]})
    unsigned.write_group(crafted.model_copy(update={"seq": 4, "games": [clean, clean]}))
    refusals = {"torn or corrupt": 1, "another run": 1, "token id out of the vocabulary": 1, "unsigned or forged": 1}
    wait_until(lambda: status(t)["groups_refused"] == refusals and status(t)["staleness"]["dropped"] >= 2, 120,
               "the crafted files refused and the stale group dropped")
    at = status(t)["step"]
    wait_until(lambda: status(t)["step"] >= at + 2, 240, "two more steps after the refusals")
    assert status(t)["state"] == "running" and status(t)["error"] is None

    # a server that joins late is used; the killed one is shown as gone
    fleet.rollout("c")
    wait_until(lambda: any(p.split(".")[1] == "c" for s in history(t)["steps"] for p in s["groups"]),
               240, "a step trained on the late server's games")
    assert wait_until(lambda: table().get("b", {}).get("state") == "gone", 60, "the killed server shown as gone")

    # paused: the servers stop producing and the trainer publishes nothing
    assert httpx.post(f"{t}/control", json={"action": "pause", "token": OWNER}).status_code == 200
    # it holds at the end of the step in flight, or that step waits for groups the paused servers no longer play
    wait_until(lambda: (s := status(t))["held"] or s["waiting_for_rollouts"], 120, "the trainer to hold")
    servers = [fleet.url("a"), fleet.url("c")]
    wait_until(lambda: all(status(u)["fleet_state"] == "paused" for u in servers), 30, "servers paused")

    def counts() -> tuple[list[int], int]:
        return [status(u)["groups_written"] for u in servers], status(t)["version"]

    before = steady(counts, "a batch in flight at the pause to be written")
    time.sleep(3.0)
    assert counts() == before

    # stopped: every group accounted for
    assert httpx.post(f"{t}/control", json={"action": "stop", "token": OWNER}).status_code == 200
    final = wait_until(lambda: (s := status(t))["state"] == "stopped" and s["version"] == s["trainer_version"] and s,
                       60, "the trainer to stop, its last version committed")
    steps = history(t)["steps"]
    written = written_groups(*(fleet.servers[name][0].output() for name in ("a", "b", "c")))
    trained = [p for s in steps for p in s["groups"]]
    dropped = re.findall(r"dropped group (fleet/groups/\S+\.json)", trainer.output())
    left = [f.path for f in FleetBucket(fleet.bucket).list_groups()]
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    accounted = set(trained) | (set(dropped) - {stale.path}) | set(left)
    assert set(written) <= accounted, f"committed groups lost: {sorted(set(written) - accounted)}"
    # only the killed server may have committed a group and died before it logged it
    assert all(p.split(".")[1] == "b" for p in accounted - set(written)) and len(accounted - set(written)) <= 1
    assert not set(trained) & (set(dropped) | set(left))
    assert stale.path in dropped and stale.path not in trained
    assert not any(".crafted." in p or p.split("/")[-1].startswith("19990101") for p in trained)
    assert {p.split(".")[1] for p in trained} == {"a", "b", "c"}
    for s in steps:
        assert all(int(k) <= 1 for k in s["staleness"]), s
        assert s["ratio_mean"] is not None and 0 < s["ratio_min"] <= s["ratio_mean"] <= s["ratio_max"] <= 3.0, s
        assert len(s["groups"]) == 4 and sum(s["staleness"].values()) == 8
    log = trainer.output()
    assert "refused rollout group fleet/groups/" in log and "Traceback" not in log
    assert final["error"] is None and final["device"] == "cpu"
    return {**final, "history": history(t)}


# --- 3. a new key, resumed ----------------------------------------------------------------------------------------------


def greedy(url: str) -> tuple[int, list[int], list[float]]:
    body = httpx.post(f"{url}/generate", json={"prompts": [PROMPT], "max_tokens": 6, "temperature": 0}, timeout=60,
                      headers={"Authorization": f"Bearer {TOKENS['ROLLOUT_TOKEN']}"}).json()
    [c] = body["completions"]
    return body["version"], c["token_ids"], c["logprobs"]


def local_logprobs(model: str, state: dict[str, torch.Tensor] | None) -> tuple[list[int], list[float]]:
    """The same greedy completion from an engine in this process, on `state` (None: the model as built)."""
    engine = open_engine("transformers", EngineConfig(model))
    try:
        if state is not None:
            engine.update(state, version=1)
        [c] = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0))
        return c.token_ids, c.logprobs
    finally:
        engine.close()


def bucket_state(bucket: str, version: int) -> dict[str, torch.Tensor]:
    with delta.Subscriber(bucket) as sub:
        assert sub.sync(version) == version
        return {k: v.clone() for k, v in sub.state.items()}


def stopped(url: str, steps: int) -> dict:
    """The trainer's status once it stopped at `steps` with its last version committed; its answers hold exactly
    their messages' keys (the typed-message tests see them empty)."""
    final = wait_until(lambda: (s := status(url))["state"] == "stopped" and s["step"] == steps
                       and s["version"] == s["trainer_version"] and s, 300, f"the trainer's step {steps}")
    assert final["error"] is None, final["error"]
    done = history(url)
    assert set(final["staleness"]) == set(Staleness.model_fields)
    assert set(done["steps"][-1]) == set(StepRecord.model_fields)
    assert set(done["payloads"][-1]) == set(Payload.model_fields)
    assert httpx.get(f"{url}/").status_code == 200
    return {**final, "history": done}


def check_a_trainer_with_a_new_key_resumes_hands_over_and_is_served_bit_for_bit(
        fleet: Fleet, before: dict, old: delta.SigningKey, new: delta.SigningKey) -> dict:
    old_file = fleet.root / "trainer-home" / "old.key"
    old_file.parent.mkdir()
    old_file.write_text(old.secret_text())
    old_file.chmod(0o600)
    a, c = fleet.url("a"), fleet.url("c")
    assert status(a)["trust"].startswith(f"trainer key {old.public.fingerprint} (trusted on first use")
    with contextlib.ExitStack() as up:
        second = fleet.trainer("trainer-2.log", "--max-steps", "2", "--handover-from-file",
                               str(old_file), key=new, stack=up)
        after = stopped(second.url, before["step"] + 2)
        log = second.output()
    # resumed its own versions, numbering and history going on, the next delta based on the last version
    assert (after["resumed_from"], after["resumed_hash"]) == (before["version"], before["state_hash"])
    assert after["version"] > before["version"] and "signed again with this trainer's new key" in log
    assert old.secret_text()[16:] not in log
    steps = after["history"]["steps"]
    assert steps[:len(before["history"]["steps"])] == before["history"]["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))  # one count across both processes
    payloads = before["history"]["payloads"]
    assert after["history"]["payloads"][:len(payloads)] == payloads and after["history"]["anchors"][0]["version"] == 1
    assert all(0 < p["delta_bytes"] < p["raw_bytes"] for p in payloads if p["changed"])
    manifest = delta.read_manifest(fleet.bucket)
    assert [v.version for v in manifest.versions][-1] == after["version"] == manifest.latest.version
    resumed = manifest.get(before["version"] + 1)  # a delta on the last version (an anchor beside it where the
    assert resumed.delta and resumed.base_hash == before["state_hash"]  # cadence falls: `anchor_every`, 50 versions)
    assert manifest.latest.state_hash == after["state_hash"]
    # the servers follow the new key, trusting it by the handover, and take the new run at once
    assert {(r["id"], r["authenticated"], r["trusts_trainer"]) for r in after["fleet"] if r["id"] != "b"} == {
        ("a", True, True), ("c", True, True)}  # ("b", killed in the first run, is not in it)
    for url in (a, c):
        served = wait_until(lambda u=url: (s := status(u))["version"] == after["version"] and s, 120,
                            "a server at the new key's last version")
        assert served["fleet_run"] == after["run_id"] and served["refused"] == {} and served["failures"] == 0
        assert served["trust"].startswith(f"trainer key {new.public.fingerprint} (handed over from "
                                          f"{old.public.fingerprint}")
        assert served["state_hash"] == after["state_hash"] and served["device"] == "cpu"
    # what a server serves is the bucket's version bit for bit
    state = bucket_state(fleet.bucket, after["version"])
    assert delta.state_digest(state).hexdigest == after["state_hash"]
    initial = delta.load_state(fleet.model)
    assert sum(int((state[k].view(torch.int16) != initial[k].view(torch.int16)).sum()) for k in state) > 0
    version, tokens, logprobs = greedy(a)
    assert version == after["version"] and (tokens, logprobs) == local_logprobs(fleet.model, state)
    assert logprobs != local_logprobs(fleet.model, None)[1], "the check cannot tell the initial model apart"
    return after


# --- 4. two ranks ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def fleet_ranks(fleet: Fleet, key: delta.SigningKey, *flags: str, log: Path) -> Iterator[tuple[str, Any]]:
    """Two trainer ranks of the fleet's run (torchrun), signing with `key`, until rank 0's /health answers."""
    env = {"ROLLOUT_TOKEN": TOKENS["ROLLOUT_TOKEN"], "OWNER_TOKEN": OWNER, "DELTA_SIGNING_KEY": key.secret_text()}
    with torchrun_trainer("--bucket", fleet.bucket, "--model", fleet.model, "--env-url", fleet.env_url, "--device",
                          "cpu", *flags, *FAST_TRAINING, log=log, env=env) as running:
        yield running


def check_two_ranks_resume_one_take_every_ranks_groups_and_publish_a_share_each(fleet: Fleet, before: dict,
                                                                              key: delta.SigningKey) -> dict:
    """Rank 0 serves the API and takes every rank's groups; each rank publishes its own share of the weights, one
    file per rank per version, and a reader rebuilds the last version from both ranks' files to the hash the trainer
    reports."""
    log, ranked = fleet.root / "trainer-3.log", 3
    with fleet_ranks(fleet, key, "--max-steps", str(ranked), log=log) as (url, proc):
        done = stopped(url, before["step"] + ranked)
        assert (done["resumed_from"], done["resumed_hash"]) == (before["version"], before["state_hash"])
        # since the resume rank 0 took both ranks' groups: 4 groups of 2 games a rank, each group once
        taken = [len(step["groups"]) for step in done["history"]["steps"]]
        assert taken == [4] * before["step"] + [8] * ranked
        groups = [g for step in done["history"]["steps"] for g in step["groups"]]
        assert len(set(groups)) == len(groups)
        refused = httpx.post(f"{url}/control", json={"action": "start", "token": OWNER}, timeout=10)
        assert refused.status_code == 409 and "start torchrun again" in refused.json()["detail"]
        storage = delta.Bucket.open(fleet.bucket)
        manifest = delta.read_manifest(storage)
        deltas = [v for v in manifest.versions if v.version > before["version"] and v.kind == "delta"]
        assert manifest.latest.version == done["version"] and deltas
        assert all(sorted(f.rank for f in v.delta) == [0, 1] for v in deltas)  # one file per rank per version
        with delta.Subscriber(storage) as reader:
            reader.sync()
            # The state hash is the whole tensors' however the ranks cut them: the state rebuilt from both ranks'
            # files hashes to the one the trainer reported, whole tensors under their own names, trained.
            assert delta.state_digest(reader.state).hexdigest == manifest.latest.state_hash == done["state_hash"]
            assert sorted(reader.state) == sorted(delta.load_state(fleet.model))
        # both ranks ended with the run; torchrun waits for rank 0, which serves until told to stop
        assert wait_until(lambda: "trainer rank 1 of 2" in log.read_text(), 10, "rank 1") and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    for name in ("a", "c"):
        wait_until(lambda u=fleet.url(name): status(u)["version"] == done["version"], 120, "the servers at v(ranks)")
    return done


# --- 6. a stranger ----------------------------------------------------------------------------------------------------


def write_run(fleet: Fleet, run_id: str, signer: delta.SigningKey) -> None:
    """Run settings as a trainer writes them (paused: nothing is played), signed with `signer`, by a fleet member (it
    holds the fleet's token, as every rollout server does, and not the trainer's key)."""
    from trainer_space import TrainerConfig
    from trainer_space.fleet import FleetRun

    bucket = FleetBucket(fleet.bucket, secret=TOKENS["ROLLOUT_TOKEN"], signing_key=signer)
    FleetRun(TrainerConfig(fleet.bucket, None, fleet.model), bucket, run_id=run_id).send(RunState.PAUSED, 0)


def edit_run(fleet: Fleet, run_id: str) -> None:
    """The trainer's run.json with another run id in its body, by a fleet member: its hash and the fleet token's HMAC
    made right, the trainer's signature kept."""
    storage = delta.Bucket.open(fleet.bucket)
    envelope = json.loads(storage.read("fleet/run.json"))
    edited = RunSettings.model_validate({**envelope["body"], "run_id": run_id})
    forged = json.loads(encode(edited, fleet_key(TOKENS["ROLLOUT_TOKEN"])))
    forged.update({k: envelope[k] for k in ("signer", "signature", "handovers") if k in envelope})
    storage.write("fleet/run.json", json.dumps(forged).encode())


def check_the_servers_refuse_a_strangers_versions_and_settings_and_take_the_trainers_next(
        fleet: Fleet, run: dict, trainer: dict, key: delta.SigningKey) -> None:
    """A stranger with write access to the bucket (another process, its own home) publishes a well-formed next version
    with `delta.Publisher`, and another by copying the trainer's signature onto it; then run settings of its own, and
    the trainer's settings edited under the trainer's signature. Each server refuses every one in one line, keeps the
    trainer's version (`trainer`'s last) and settings (`run`'s), counts and shows the refusals, then takes the
    trainer's next version, published from its own key and state, bit for bit."""
    trainers = delta.read_manifest(fleet.bucket).latest
    assert trainers.version == trainer["version"]
    state = bucket_state(fleet.bucket, trainer["version"])
    refused = {name: status(fleet.url(name))["refused"] for name in ("a", "c")}

    def counted(what: str, more: int) -> Callable[[], bool]:
        return lambda: all(status(fleet.url(n))["refused"].get(what, 0) == refused[n].get(what, 0) + more
                           for n in ("a", "c"))

    stranger = publish_as_stranger(fleet.bucket, fleet.root / "stranger")
    assert stranger == trainer["version"] + 1
    wait_until(counted("untrusted version", 1), 60, "the stranger's version refused")
    copy_signature(fleet.bucket, trainers)
    wait_until(counted("untrusted version", 2), 60, "the copied signature refused")
    write_run(fleet, "stranger-run", delta.SigningKey.generate())
    wait_until(counted("untrusted run settings", 1), 60, "the stranger's settings refused")
    write_run(fleet, run["run_id"], key)  # the trainer's settings again (its key), then edited under its signature
    edit_run(fleet, "edited-run")
    wait_until(counted("untrusted run settings", 2), 60, "the edited settings refused")
    for name in ("a", "c"):
        now = status(fleet.url(name))
        assert (now["version"], now["fleet_run"], now["failures"]) == (trainer["version"], run["run_id"], 0)
        assert now["state_hash"] == trainers.state_hash and now["authenticated"]
        assert now["last_refusal"].startswith(f"version {stranger}: the signature does not match")
        page = status_markdown(RolloutStatus.model_validate(now))
        assert "refused: untrusted run settings 2 · untrusted version 2" in page
        assert f"**last refused:** version {stranger}: the signature does not match" in page
        assert f"checked with the trainer key {key.public.fingerprint} (" in page  # handed over, or kept since
        log = fleet.servers[name][0].output()
        assert log.count(f"REFUSED version {stranger}") == 2 and log.count("REFUSED the run's settings") == 2
        assert "Traceback" not in log

    # the trainer's next version, from its own manifest (the stranger's left behind), bit for bit
    nudged = {n: t + (t.abs().max() * 1e-2 if t.is_floating_point() else 0) for n, t in state.items()}
    with delta.Publisher(fleet.bucket, signing_key=key) as own:
        own.publish(nudged)
        assert own.flush(120) and own.last.version == trainer["version"] + 1
        expected = own.last.state_hash
    assert expected == delta.state_digest(nudged).hexdigest
    for name in ("a", "c"):
        served = wait_until(lambda u=fleet.url(name): (s := status(u))["version"] == trainer["version"] + 1 and s, 120,
                            "the trainer's next version served")
        assert served["state_hash"] == expected

# --- 5. one rank resumes two, and rides out outages ----------------------------------------------------------------------


def ride_out(trainer: str, outage: Callable[[], None], restart: Callable[[], None], *says: str) -> None:
    """Stop a server (`outage`), check the trainer retries while running with an error that says one of `says`,
    `restart` it, and check steps resume."""
    before = status(trainer)["step"]
    outage()
    failing = wait_until(lambda: (s := status(trainer))["rollout_failing"] and s, 60, "the trainer to see the outage")
    assert failing["state"] == "running" and failing["error"] is None
    assert any(s in failing["rollout_error"] for s in says), failing["rollout_error"]
    restart()
    # A step after the restart, and the failures in a row cleared: a step may end on games fetched while a request
    # begun in the outage still fails (the count clears at the next request that succeeds).
    back = wait_until(lambda: (s := status(trainer))["step"] > max(before, failing["step"])
                      and s["rollout_failing"] == 0 and s, 120, "a step after the restart, its failures cleared")
    assert back["state"] == "running" and back["error"] is None
    assert back["rollout_error"]  # the last error stays on show, marked recovered


def check_one_rank_resumes_two_and_rides_out_an_env_and_a_rollout_outage(fleet: Fleet, ranked: dict,
                                                                         key: delta.SigningKey) -> dict:
    """One rank resumes what two published: the bucket's pieces become whole tensors again, and its first version,
    written in another layout, is an anchor of one file. In request mode against
    server "a", with the fleet's tokens (as `python app.py` starts them): the env, then "a", stopped and started again
    on its port; training stays `running`, `/status` shows the error while it retries, steps resume once the server is
    back, and the owner's stop ends the wait between retries. The servers take the trainer's next version."""
    a_port = int(fleet.url("a").rsplit(":", 1)[1])
    with contextlib.ExitStack() as up:
        trainer = fleet.trainer("trainer-4.log", "--max-steps", "1000", key=key, stack=up, fleet=False).url
        after = wait_until(lambda: (s := status(trainer))["step"] > ranked["step"] and s["version"] > ranked["version"]
                           and s, 300, "a step on one rank")
        assert after["error"] is None and after["mode"] == "request"
        assert (after["resumed_from"], after["resumed_hash"]) == (ranked["version"], ranked["state_hash"])
        storage = delta.Bucket.open(fleet.bucket)
        manifest = delta.read_manifest(storage)
        first = manifest.get(ranked["version"] + 1)
        assert (first.kind, first.delta, [f.rank for f in first.anchor]) == ("anchor", (), [0] * len(first.anchor))
        with delta.Subscriber(storage) as reader:
            assert reader.sync(first.version) == first.version
            assert delta.state_digest(reader.state).hexdigest == first.state_hash
        for name in ("a", "c"):  # the servers take its versions
            wait_until(lambda u=fleet.url(name): status(u)["version"] >= first.version, 120, "the trainer's next")

        ride_out(trainer, fleet.env_up.close, fleet.start_env, "(HTTP 502)")  # the rollout's games fail on the env
        a_app, a_up = fleet.servers["a"]
        ride_out(trainer, a_up.close, lambda: fleet.rollout("a", port=a_port), *STOPPING_ROLLOUT)
        fleet.servers["a"][1].close()  # the owner's stop ends the wait between retries
        wait_until(lambda: status(trainer)["rollout_failing"], 60, "the trainer to see the rollout gone")
        stop = httpx.post(f"{trainer}/control", json={"action": "stop"}, headers={"Authorization": f"Bearer {OWNER}"})
        assert stop.status_code == 200
        final = wait_until(lambda: (s := status(trainer))["state"] == "stopped" and s, 10, "the stop")
        assert final["error"] is None
        final = wait_until(lambda: (s := status(trainer))["version"] == s["trainer_version"] and s, 60,
                           "its last version committed")
    players = {g["player"] for g in httpx.get(f"{fleet.env_url}/games", params={"limit": 50}).json()}
    assert any(p.startswith("policy v") for p in players), players  # the rollout sent the env token
    fleet.rollout("a", port=a_port)
    for name in ("a", "c"):
        wait_until(lambda u=fleet.url(name): status(u)["version"] == final["version"], 120, "the servers at its last")
    return final


# --- 7. a third key ---------------------------------------------------------------------------------------------------


def check_a_trainer_with_a_third_key_is_refused_and_told_the_servers_trust_another(
        fleet: Fleet, new: delta.SigningKey, third: delta.SigningKey) -> None:
    """A trainer restarted with a third key and no handover starts a run of its own, which the servers refuse (counted,
    shown on their pages) while they keep serving the last version the trainer signed; that trainer's fleet table says
    the servers trust another key. No secret of the trainer's is in a server's log nor in the bucket."""
    from trainer_space.ui import fleet_html

    held = {name: status(fleet.url(name)) for name in ("a", "c")}
    with contextlib.ExitStack() as up:
        stranger = fleet.trainer("trainer-5.log", "--max-steps", "1", "--exam-every", "0", key=third, stack=up).url
        wait_until(lambda: all(status(fleet.url(n))["refused"].get("untrusted run settings", 0)
                               > held[n]["refused"].get("untrusted run settings", 0) for n in ("a", "c")), 120,
                   "its settings refused")
        seen = wait_until(lambda: (s := status(stranger))["fleet"] and len(s["fleet"]) >= 2
                          and not any(r["trusts_trainer"] for r in s["fleet"]) and s, 120,
                          "the third trainer's fleet table")
        assert seen["resumed_from"] is None  # none of the versions is its own: a run of its own
        page = fleet_html(TrainerStatus.model_validate(seen).fleet)
        assert f"<b>⚠ another key {new.public.fingerprint[:19]}…</b>" in page
        assert "Trusting another key than this trainer&#x27;s:" in page
    seed = new.secret_text().split(":", 1)[1]
    for name in ("a", "c"):
        now = status(fleet.url(name))
        assert (now["version"], now["fleet_run"]) == (held[name]["version"], held[name]["fleet_run"])
        assert "refused: untrusted run settings" in status_markdown(RolloutStatus.model_validate(now))
        log = fleet.servers[name][0].output()
        assert "Traceback" not in log and seed not in log
    assert not [f for f in Path(fleet.bucket).rglob("*") if f.is_file() and seed.encode() in f.read_bytes()]
