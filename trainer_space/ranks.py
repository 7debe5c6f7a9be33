"""The trainer's ranks under `torchrun`: which process is the main one, and what it tells the others.

`torchrun --nproc_per_node N app.py trainer ...` starts N trainer processes. Rank 0 is the trainer people
see: it serves the UI and HTTP API, writes the run's state to the bucket, takes the step's groups of games
from the fleet and decides start, pause and stop. Every rank trains (TRL and accelerate keep the
replicas in step) and publishes its own share of the weights (`delta.pieces.split`). What rank 0 decides
reaches the others as small objects broadcast over a gloo group of their own, with a long timeout: a rank
waits in a broadcast for as long as rank 0 is paused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

#: How long a rank waits for rank 0 in one broadcast (a paused run holds the others that long at most).
WAIT_FOR_MAIN = timedelta(days=7)


@dataclass(frozen=True)
class TrainerRanks:
    """This process's place among the trainer's ranks (rank 0 of 1 without `torchrun`).

    Attributes:
        rank: This rank.
        world: Number of ranks.
        group: The gloo group the ranks talk over (None for one rank); also the publisher's.
    """

    rank: int = 0
    world: int = 1
    group: Any = None

    @classmethod
    def from_environment(cls) -> TrainerRanks:
        """From `torchrun`'s variables (`WORLD_SIZE`, `RANK`, ...): joins the default process group (gloo on a
        CPU; gloo and NCCL where CUDA is, as accelerate would) and makes the ranks' own gloo group. Where CUDA
        is, each rank takes the GPU of its `LOCAL_RANK` first, so that `cuda` is that GPU (as accelerate does,
        but before the model loads: the trainer loads it before accelerate starts)."""
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world == 1:
            return cls()
        dist = torch.distributed
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0") or 0))
        if not dist.is_initialized():
            dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        group = dist.new_group(backend="gloo", timeout=WAIT_FOR_MAIN)
        return cls(dist.get_rank(), dist.get_world_size(), group)

    @property
    def main(self) -> bool:
        """The rank that serves the UI, talks to the fleet and decides."""
        return self.rank == 0

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` (any picklable object), on every rank."""
        if self.world == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(
            box, src=torch.distributed.get_global_rank(self.group, 0), group=self.group
        )
        return box[0]
