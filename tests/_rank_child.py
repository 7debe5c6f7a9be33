"""One trainer rank for test_publish: `python -m tests._rank_child BUCKET RANK WORLD PORT`.

Each rank publishes its half of the tensors of `trajectory(6)`, one version per state; the second
publisher run resumes from the bucket."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist

from delta.publish import Publisher, PublisherConfig

from ._trainer import trajectory


def main(bucket: str, rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    states = trajectory(6)
    names = sorted(states[0])[rank::world]
    config = PublisherConfig(anchor_every=100, commit_timeout=60)
    with Publisher(bucket, config) as pub:
        for s in states[1:4]:
            pub.publish({n: s[n] for n in names})
            assert pub.flush(timeout=60)
    with Publisher(bucket, config) as pub:  # resumes: numbering continues, base pulled from the bucket
        assert pub.last.version == 3
        for s in states[4:]:
            pub.publish({n: s[n] for n in names})
            assert pub.flush(timeout=60)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
