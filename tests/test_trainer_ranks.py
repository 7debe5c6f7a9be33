"""`torchrun --nproc_per_node 2 app.py trainer`: two trainer ranks (CPU, gloo) of a LoRA run publish a share each that
a rollout server follows; the trainer's publish callback under FSDP2 publishes each rank's shards without a gather;
the FSDP2 launch config is one accelerate reads as such. Two ranks resuming one and one resuming two, on the full
weights, are tests/test_product_fleet.py's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

import delta
from tests._env_server import REPO, free_port, running_app, running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, torchrun_trainer, wait_until

STEPS = 3


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()



def test_a_lora_run_on_two_ranks_publishes_a_share_each_that_a_rollout_follows(tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 2 app.py trainer --lora-r 4 --lora-sync adapter`: TRL wraps each rank's model with
    PEFT and every rank publishes its share of the adapter; a rollout server started on the empty bucket follows the
    run's mode and serves the last version with the trainer's hash. (Merged mode's shares per rank are
    `test_fsdp2_ranks_publish_their_shards_through_the_trainer_callback[merged]`'s, and its run through the app with a
    rollout following is tests/test_lora_e2e.py's: the two-rank app run was the same run again, 30 s.)"""
    sync = "adapter"
    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    shared = ("--bucket", bucket, "--model", model)
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        rollout = stack.enter_context(running_app("rollout", *shared, "--env-url", env, "--server-id", "a", "--engine",
                                                  "transformers", "--poll-interval", "0.2", "--showcase-every", "0",
                                                  log=tmp_path / "rollout.log"))
        url, _ = stack.enter_context(torchrun_trainer(*shared, "--env-url", env, "--max-steps", "2", "--device", "cpu",
                                                      *FAST_TRAINING, "--learning-rate", "3e-2", "--lora-r", "4",
                                                      "--lora-sync", sync, log=tmp_path / "trainer.log"))
        done = wait_until(lambda: (s := status(url))["step"] >= 2 and s["state"] == "stopped" and s, 300,
                          "2 LoRA steps on two ranks")
        assert done["error"] is None, done["error"]
        assert done["lora"]["sync"] == sync and done["lora"]["r"] == 4

        storage = delta.Bucket.open(bucket)
        manifest = delta.read_manifest(storage)
        assert manifest.latest.version == done["version"] >= 2
        assert all({f.rank for f in v.files} == {0, 1} for v in manifest.versions)  # each rank wrote its share
        with delta.Subscriber(storage) as reader:
            reader.sync()
            state = reader.state
            assert reader.digest.hexdigest == manifest.latest.state_hash == done["state_hash"]
        assert state and all(".lora_A." in n or ".lora_B." in n for n in state)
        assert any(t.abs().max() > 0 for n, t in state.items() if ".lora_B." in n)  # trained from zero
        served = wait_until(lambda: (r := status(rollout.url))["version"] == done["version"] and r, 60,
                            "the rollout to serve the last version")
        assert served["state_hash"] == done["state_hash"] and served["last_error"] is None


@pytest.mark.parametrize("lora_sync", ["", "adapter", "merged"])
def test_fsdp2_ranks_publish_their_shards_through_the_trainer_callback(tmp_path: Path, lora_sync: str) -> None:
    """The trainer's publish callback under FSDP2 (2 gloo ranks, `fully_shard` as accelerate applies it): built
    for a whole model, it follows the sharded one from the run's start and each rank publishes the local shards
    of every weight, cast to the checkpoint's dtypes, no gather; every version read back equals the published
    state gathered with `full_tensor()`, bit for bit. A LoRA run's model (PEFT, then sharded) publishes the shards of
    its adapter (fp32, PEFT's names) or of its merged weights (the checkpoint's names and dtypes) the same way."""
    from safetensors.torch import load_file

    from trainer_space.weights import checkpoint_dtypes

    model, bucket, out = tiny_model(str(tmp_path / "model")), tmp_path / "bucket", tmp_path / "out"
    out.mkdir()
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(free_port()), "-m", "tests._fsdp_trainer_child", model,
                          str(bucket), str(out), "3", lora_sync], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = delta.read_manifest(str(bucket))
    dtypes = {n: t.dtype for n, t in load_file(str(out / "full-1.safetensors")).items()}
    if lora_sync == "adapter":
        assert dtypes and all(".lora_" in n and d == torch.float32 for n, d in dtypes.items())
    else:
        assert dtypes == checkpoint_dtypes(model)
    names = set(dtypes)
    assert [v.version for v in manifest.versions] == [1, 2, 3]
    assert all({f.rank for f in v.files} == {0, 1} for v in manifest.versions)
    # every weight travels as two dim-0 pieces, one per rank: no rank published a whole tensor
    assert set(manifest.pieces) == names
    assert all(len(s.pieces) == 2 and s.dim == 0 for s in manifest.pieces.values())
    reader = delta.Subscriber(str(bucket))
    for version in (1, 2, 3):
        full = load_file(str(out / f"full-{version}.safetensors"))
        assert reader.sync(version) == version
        assert set(reader.state) == names
        assert all(torch.equal(reader.state[n], full[n]) for n in names)
        assert reader.digest.hexdigest == manifest.get(version).state_hash
    first, last = load_file(str(out / "full-1.safetensors")), load_file(str(out / "full-3.safetensors"))
    assert any(not torch.equal(first[n], last[n]) for n in names)  # the steps trained the weights


def test_the_fsdp2_launch_config_is_one_accelerate_reads_as_fsdp2_with_every_rank_loading_the_model() -> None:
    """`accelerate launch --config_file trainer_space/fsdp2.yaml`: FSDP version 2, and no RAM-efficient loading
    (ranks > 0 would hold empty weights when the trainer resumes the bucket's version into the model)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    config = load_config_from_file(str(REPO / "trainer_space" / "fsdp2.yaml"))
    assert config.distributed_type == DistributedType.FSDP
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_cpu_ram_efficient_loading"] is False
    assert config.use_cpu is False
