"""The product end to end on a Hugging Face bucket: env, trainer and two rollout servers as real processes, sharing
nothing but `hf://buckets/team/fleet-run` on the local Hub (tests/local_hub: the real huggingface_hub and hf_xet),
each role with a token of its own, on the Hub's budget (`delta.Budget`), as deployed. Versions are published and
served with the trainer's state hashes, groups go through the bucket, the pages count the bucket's requests, a rollout
server is SIGKILLed and comes back, a storm of 429s and 503s is survived with the pages saying so, a reader holding a
read-only token follows bit for bit, and a restarted trainer resumes from the bucket.

What the fleet asks of the account per 5 minutes is a rate, measured by `python -m bench.hub_requests` (docs/
benchmarks.md), not here; the cost of each operation (a published version, a followed one, a batch of groups, a
heartbeat) is counted exactly in tests/test_hub_budget.py.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests._env_server import running_app, running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, wait_until

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub

BUCKET = "hf://buckets/team/fleet-run"
ROLLOUT_FLAGS = ("--engine", "transformers", "--showcase-every", "0")  # the Hub's budget (delta.Budget), as deployed


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def manifest_hashes(hub: LocalHub) -> dict[int, str]:
    """The state hash of every version the bucket lists, read with a read-only token (waiting out a rate limit)."""
    from delta import read_manifest
    from delta.errors import RateLimitedError
    from delta.storage import open_storage

    reader = open_storage(BUCKET, token=hub.token("alice", "read"), endpoint=hub.endpoint)  # alice: of the org
    for _ in range(5):
        try:
            manifest = read_manifest(reader)
            return {v.version: v.state_hash for v in manifest.versions} if manifest else {}
        except RateLimitedError as e:
            time.sleep(max(0.0, e.retry_at - time.time()) + 0.1)
    raise AssertionError("the bucket stayed rate-limited")


def member(hub: LocalHub, name: str, scope: str = "write") -> str:
    """A token of a user of its own, a member of the bucket's org: the local Hub then counts each role apart."""
    hub.add_user(name, ["team"])
    return hub.add_token(name, scope)


def test_the_product_trains_through_a_hub_bucket_through_a_killed_server_a_storm_and_a_restart(
    tmp_path: Path, local_hub: LocalHub
) -> None:
    model = tiny_model(str(tmp_path / "model"))
    tokens = {role: member(local_hub, role) for role in ("trainer", "a", "b")}

    def env_of(role: str) -> dict[str, str]:  # each role its own token (a fleet member writes groups: write scope)
        return {**local_hub.env("alice"), "HF_TOKEN": tokens[role], "HF_XET_CACHE": str(tmp_path / f"xet-{role}")}

    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))

        def rollout(name: str):
            flags = ("--bucket", BUCKET, "--model", model, "--env-url", env, "--server-id", name, *ROLLOUT_FLAGS)
            return stack.enter_context(running_app("rollout", *flags, env=env_of(name), log=tmp_path / f"{name}.log"))

        trainer = stack.enter_context(running_app(
            "trainer", "--bucket", BUCKET, "--model", model, "--env-url", env, "--max-steps", "14", *FAST_TRAINING,
            env=env_of("trainer"), log=tmp_path / "trainer.log"))
        a, b = rollout("a"), rollout("b")

        # versions published and served with the trainer's state hashes
        wait_until(lambda: status(trainer.url)["version"] >= 1, 300, "a first version published on the Hub bucket")
        # a hash is claimed only while the state decoded is the one served (not while a newer one waits for a batch)
        served = wait_until(lambda: (s := status(a.url))["version"] >= 1 and s["state_hash"] and s, 120,
                            "a to serve a published version")
        assert served["state_hash"] == manifest_hashes(local_hub)[served["version"]]

        # the pages count what the local Hub counted, by class
        wait_until(lambda: status(trainer.url)["bucket_traffic"]["last_5min"]["api"] > 0, 60, "the trainer's count")
        assert local_hub.counts()["users"]["trainer"]["api"] > 0 and status(a.url)["bucket_traffic"]["total"]["api"] > 0

        # a rollout server killed with SIGKILL, and started again under its name
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        b = rollout("b")
        back = wait_until(lambda: (s := status(b.url))["version"] >= 1 and s["state_hash"] and s, 120,
                          "b back, serving a version")
        assert back["state_hash"] == manifest_hashes(local_hub)[back["version"]]

        # a storm: the Hub throttles listings and fails batch calls for a while
        local_hub.add_fault(kind="status", route="api.tree", status=429, times=6,
                            rate_limit={"resource": "api", "remaining": 0, "reset": 3, "limit": 1000, "window": 300})
        local_hub.add_fault(kind="status", route="api.batch", status=503, times=6)
        throttled = wait_until(
            lambda: [s["bucket_traffic"] for s in (status(trainer.url), status(a.url), status(b.url))
                     if s["bucket_traffic"]["rate_limited"]], 120, "an app to say it was rate-limited")
        assert all(t["limit"].get("api") == 1000 for t in throttled)

        final = wait_until(lambda: (s := status(trainer.url))["state"] == "stopped" and s, 600, "the run to end")
        assert final["error"] is None and final["step"] == 14 and final["version"] >= 3
        hashes = manifest_hashes(local_hub)
        assert final["state_hash"] == hashes[final["version"]]
        assert {s["id"] for s in final["fleet"]} == {"a", "b"}
        assert all(step["groups"] for step in httpx.get(f"{trainer.url}/history", timeout=10).json()["steps"])
        for server in (a, b):
            done = wait_until(lambda s=server: (st := status(s.url))["version"] == final["version"] and st, 120,
                              "the servers to serve the last version")
            assert done["state_hash"] == final["state_hash"]

        # a reader with a read-only token follows the bucket bit for bit
        from delta import Subscriber

        with Subscriber(BUCKET, token=member(local_hub, "reader", "read"), endpoint=local_hub.endpoint) as reader:
            assert reader.sync() == final["version"]
            assert reader.digest.hexdigest == final["state_hash"]

        # the trainer stopped, started again on the same bucket: it resumes from its last version
        trainer.proc.send_signal(signal.SIGTERM)
        trainer.proc.wait(60)
        again = stack.enter_context(running_app(
            "trainer", "--bucket", BUCKET, "--model", model, "--env-url", env, "--max-steps", "1", *FAST_TRAINING,
            env=env_of("trainer"), log=tmp_path / "trainer-again.log"))
        resumed = wait_until(lambda: (s := status(again.url))["state"] == "stopped" and s, 300, "the resumed run")
        assert resumed["resumed_from"] == final["version"] and resumed["error"] is None
        assert resumed["version"] > final["version"] and resumed["step"] == 15
        assert local_hub.counts()["classes"]["unknown"] == 0, local_hub.counts()["unknown"]
