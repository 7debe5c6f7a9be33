"""One rank of the trainer's publishing under FSDP2, for test_trainer_ranks:
`torchrun --nproc_per_node 2 -m tests._fsdp_trainer_child MODEL BUCKET OUT STEPS [LORA_SYNC]`.

What the trainer does under `accelerate launch --config_file trainer_space/fsdp2.yaml`, without TRL (accelerate
uses its FSDP plugin on GPUs only): each rank loads the whole model with fp32 master weights and builds its
publish callback as `TrainerParts` does (a replicated rank's share in mind); then the model is sharded with
`fully_shard` (what accelerate's `prepare` does), the callback sees it when the run begins, and every AdamW
step ends in the callback's publish. With LORA_SYNC (`adapter` or `merged`) the model is first wrapped with PEFT (r 4,
as TRL's `peft_config` does) and the callback takes the run's `lora.lora_master` when the run begins. Rank 0 writes, for the test to compare, the published state gathered
with `full_tensor()` after each version."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

import delta
from trainer_space.publishing import PublishCallback
from trainer_space.ranks import TrainerRanks
from trainer_space.weights import master_tensors, published_state


def main(model_path: str, bucket: str, out: str, steps: int, lora_sync: str = "") -> None:
    ranks = TrainerRanks.from_environment()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    master = master_tensors(model, model_path)
    master_of = lambda m: master_tensors(m, model_path)  # noqa: E731
    if lora_sync:
        from peft import get_peft_model

        from tests._lora import settings
        from trainer_space.lora import lora_master

        model = get_peft_model(model, settings(model_path, lora_sync).peft_config())
        master_of = lambda m: lora_master(m, model_path, lora_sync)  # noqa: E731
    with delta.Publisher(bucket, delta.PublisherConfig(anchor_every=3, commit_timeout=60), group=ranks.group) as pub:
        callback = PublishCallback(pub, published_state(master, model_path), 0, master=master, rank=ranks.rank,
                                   world=ranks.world, master_of=master_of)
        mesh = init_device_mesh("cpu", (ranks.world,))
        for layer in (model.get_base_model() if lora_sync else model).model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        callback.on_train_begin(None, None, None, model=model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(ranks.rank))
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            callback.on_step_end(None, None, None)
            assert pub.flush(timeout=60)
            full = {k: v.full_tensor().clone() for k, v in callback.state.items()}  # collective: every rank gathers
            if ranks.main:
                save_file(full, os.path.join(out, f"full-{pub.last.version}.safetensors"))
    dist.barrier()  # tear down together: a rank leaving while the other still talks to it aborts it (gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
