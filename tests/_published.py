"""A bucket with weight versions published in it, for tests of what is judged against the newest published version
(exam records ahead of it are refused)."""

from __future__ import annotations

import torch

from delta import Publisher, PublisherConfig


def publish_versions(bucket: str, count: int) -> None:
    """Publish versions 1..`count` (a tiny state, one element changed each time) to `bucket`."""
    state = {"w": torch.zeros(8, dtype=torch.float32)}
    with Publisher(bucket, PublisherConfig(anchor_every=1000)) as publisher:
        for i in range(count):
            state["w"][i % 8] += 1
            publisher.publish(state)
            assert publisher.flush(timeout=60)
