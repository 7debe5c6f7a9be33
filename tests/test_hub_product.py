"""The product end to end on a Hugging Face bucket: env, trainer and two rollout servers as real processes, sharing
nothing but `hf://buckets/alice/fleet-run` on the local Hub (tests/local_hub: the real huggingface_hub and hf_xet),
each role with the token it needs. Versions are published and served with the trainer's state hashes, groups go
through the bucket, a rollout server is SIGKILLed and comes back, a storm of 429s and 503s is survived with the pages
saying so, a reader holding a read-only token follows bit for bit, and a restarted trainer resumes from the bucket.
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

BUCKET = "hf://buckets/alice/fleet-run"
ROLLOUT_FLAGS = ("--engine", "transformers", "--poll-interval", "0.2", "--showcase-every", "0")


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def manifest_hashes(hub: LocalHub) -> dict[int, str]:
    """The state hash of every version the bucket lists, read with a read-only token (waiting out a rate limit)."""
    from delta import RateLimitedError, read_manifest
    from delta.storage import open_storage

    reader = open_storage(BUCKET, token=hub.token("alice", "read"), endpoint=hub.endpoint)
    for _ in range(5):
        try:
            manifest = read_manifest(reader)
            return {v.version: v.state_hash for v in manifest.versions} if manifest else {}
        except RateLimitedError as e:
            time.sleep(max(0.0, e.retry_at - time.time()) + 0.1)
    raise AssertionError("the bucket stayed rate-limited")


def test_the_product_trains_through_a_hub_bucket(tmp_path: Path, local_hub: LocalHub) -> None:
    model = tiny_model(str(tmp_path / "model"))
    trainer_env = {**local_hub.env("alice"), "HF_XET_CACHE": str(tmp_path / "xet-trainer")}
    server_token = local_hub.add_token("alice")  # a fleet member writes its groups and heartbeats: a write token

    def rollout_env(name: str) -> dict[str, str]:
        return {**local_hub.env("alice"), "HF_TOKEN": server_token, "HF_XET_CACHE": str(tmp_path / f"xet-{name}")}

    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))

        def rollout(name: str, port: int | None = None):
            return stack.enter_context(running_app(
                "rollout", "--bucket", BUCKET, "--model", model, "--env-url", env, "--server-id", name,
                *ROLLOUT_FLAGS, env=rollout_env(name), port=port, log=tmp_path / f"{name}.log"))

        trainer = stack.enter_context(running_app(
            "trainer", "--bucket", BUCKET, "--model", model, "--env-url", env, "--max-steps", "6", *FAST_TRAINING,
            env=trainer_env, log=tmp_path / "trainer.log"))
        a, b = rollout("a"), rollout("b")

        # versions published and served with the trainer's state hashes
        wait_until(lambda: status(trainer.url)["version"] >= 2, 300, "two versions published on the Hub bucket")
        served = wait_until(lambda: (s := status(a.url))["version"] >= 1 and s, 120, "a to serve a published version")
        assert served["state_hash"] == manifest_hashes(local_hub)[served["version"]]

        # a rollout server killed with SIGKILL, and started again under its name
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        b = rollout("b")
        back = wait_until(lambda: (s := status(b.url))["version"] >= 1 and s, 120, "b back, serving a version")
        assert back["state_hash"] == manifest_hashes(local_hub)[back["version"]]

        # a storm: the Hub throttles listings and fails batch calls for a while
        local_hub.add_fault(kind="status", route="api.tree_prefix", status=429, times=6,
                            rate_limit={"resource": "api", "remaining": 0, "reset": 3, "limit": 1000, "window": 300})
        local_hub.add_fault(kind="status", route="api.batch", status=503, times=6)
        throttled = wait_until(
            lambda: [s["bucket_traffic"] for s in (status(trainer.url), status(a.url), status(b.url))
                     if s["bucket_traffic"]["rate_limited"]], 120, "an app to say it was rate-limited")
        assert all(t["limit"].get("api") == 1000 for t in throttled)

        final = wait_until(lambda: (s := status(trainer.url))["state"] == "stopped" and s, 600, "the run to end")
        assert final["error"] is None and final["step"] == 6 and final["version"] >= 3
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

        with Subscriber(BUCKET, token=local_hub.token("alice", "read"), endpoint=local_hub.endpoint) as reader:
            assert reader.sync() == final["version"]
            assert reader.digest.hexdigest == final["state_hash"]

        # the trainer stopped, started again on the same bucket: it resumes from its last version
        trainer.proc.send_signal(signal.SIGTERM)
        trainer.proc.wait(60)
        again = stack.enter_context(running_app(
            "trainer", "--bucket", BUCKET, "--model", model, "--env-url", env, "--max-steps", "1", *FAST_TRAINING,
            env=trainer_env, log=tmp_path / "trainer-again.log"))
        resumed = wait_until(lambda: (s := status(again.url))["state"] == "stopped" and s, 300, "the resumed run")
        assert resumed["resumed_from"] == final["version"] and resumed["error"] is None
        assert resumed["version"] > final["version"] and resumed["step"] == 7
        assert local_hub.counts()["classes"]["unknown"] == 0, local_hub.counts()["unknown"]
