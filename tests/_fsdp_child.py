"""One FSDP2 rank for test_pieces: `torchrun --nproc_per_node 2 -m tests._fsdp_child MODEL BUCKET OUT STEPS`.

The tiny Qwen3 is sharded with `fully_shard` on a CPU gloo mesh and trained a few AdamW steps; after
each step every rank publishes its state dict as it holds it (DTensors: each rank's local shards, no
gather). Then, for the test to compare, the ranks gather the full state (`full_tensor()`) and rank 0
writes it to OUT/full-VERSION.safetensors."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from delta import Publisher, PublisherConfig


def main(model_path: str, bucket: str, out: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(rank))
    with Publisher(bucket, PublisherConfig(anchor_every=3, keep_anchors=10, commit_timeout=60)) as pub:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            state = model.state_dict()
            pub.publish(state)
            assert pub.flush(timeout=60)
            full = {k: v.full_tensor().clone() for k, v in state.items()}  # collective: every rank gathers
            if rank == 0:
                save_file(full, os.path.join(out, f"full-{pub.last.version}.safetensors"))
    dist.barrier()  # tear down together: a rank leaving while the other still talks to it aborts it (gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
