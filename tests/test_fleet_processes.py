"""The fleet through S3 (`rclone serve s3`, a bucket of this test's own on the session's server): an env, a rollout
server and a trainer as real processes that share nothing but the bucket train three steps. The fleet on a folder
bucket, with its killed, late and paused servers, crafted files and keys, is tests/test_product_fleet.py.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests._env_server import running_app, running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, wait_until

ROLLOUT_FLAGS = ("--engine", "transformers", "--poll-interval", "0.2", "--showcase-every", "0")


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def history(url: str) -> dict:
    return httpx.get(f"{url}/history", timeout=10).json()



@pytest.mark.parametrize("where", ["s3"])
def test_a_fleet_trains_through_s3(tmp_path: Path, rclone_s3, where: str) -> None:
    model = tiny_model(str(tmp_path / "model"))
    bucket = f"s3://{rclone_s3.bucket}/demo"
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
