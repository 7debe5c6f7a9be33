"""A trainer process for the SIGKILL test: `python -m tests._publish_child BUCKET FIRST LAST`.

Publishes states FIRST..LAST of `trajectory(LAST_STATE)` one version each, resuming from the bucket."""

from __future__ import annotations

import sys
import time

from delta import Publisher, PublisherConfig

from ._trainer import trajectory

STATES = 40
N = 20_000
STEP_SECONDS = 0.1  # a training step between publishes, so a kill lands after a few versions, not after all


def main(bucket: str, first: int, last: int) -> None:
    states = trajectory(STATES, n=N)
    with Publisher(bucket, PublisherConfig(anchor_every=4, keep_anchors=2)) as pub:
        for i in range(first, last + 1):
            pub.publish(states[i])
            assert pub.flush(timeout=60)
            print(i, pub.last.version, flush=True)
            time.sleep(STEP_SECONDS)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
