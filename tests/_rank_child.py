"""One trainer rank for test_publish: `python -m tests._rank_child BUCKET RANK WORLD PORT [MODE [PHASES]]`.

Each rank publishes its half of the tensors of `trajectory(6)` (MODE `names`), or, holding them all as
replicated ranks do, its share of every tensor (`split`: `delta.pieces.split`), one version per
state. PHASES: `both` (default) publishes versions 1-3, then resumes from the bucket with a second
publisher run for 4-6; `first` or `second` runs one of the two; `kill` publishes versions 1-2, then
rank 1 kills itself while version 3 is being written: rank 0 fails with `PublishError`, or, when rank 1 died
after its share had landed, commits a whole version 3."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from delta import PublishError, Publisher, PublisherConfig
from delta.bucket.pieces import split

from ._trainer import trajectory


def main(bucket: str, rank: int, world: int, port: int, mode: str = "names", phases: str = "both") -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    states = trajectory(6)
    names = sorted(states[0])[rank::world]

    def share(s):
        return split(s, rank, world, min_numel=1000) if mode == "split" else {n: s[n] for n in names}

    if phases == "kill":
        with Publisher(bucket, PublisherConfig(anchor_every=100, commit_timeout=5)) as pub:
            for s in states[1:3]:
                pub.publish(share(s))
                assert pub.flush(timeout=60)
            pub.publish(share(states[3]))
            if rank == 1:  # somewhere in version 3: before, while or after writing its files
                time.sleep(random.uniform(0, 0.02))
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                pub.flush(timeout=60)
            except PublishError as e:
                print(f"rank 0 stopped as expected: {e}")
                os._exit(0)  # the other rank is gone: no collective teardown
            # Rank 1 died after its files and its record had landed: version 3 is whole (the test checks it).
            print("rank 0 committed version 3 with rank 1's files")
            os._exit(0)
    config = PublisherConfig(anchor_every=100, commit_timeout=60)
    if phases in ("both", "first"):
        with Publisher(bucket, config) as pub:
            for s in states[1:4]:
                pub.publish(share(s))
                assert pub.flush(timeout=60)
    if phases in ("both", "second"):
        with Publisher(bucket, config) as pub:  # resumes: numbering continues, base pulled from the bucket
            assert pub.last.version == 3
            for s in states[4:]:
                pub.publish(share(s))
                assert pub.flush(timeout=60)
    dist.barrier()  # tear down together: a rank leaving while the other still talks to it aborts it (gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
