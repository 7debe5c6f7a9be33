"""Where the time of a diff or an apply goes, stage by stage, for benchmarks (`bench.codec`).

    with recording() as seconds:
        delta.diff(old, new)
    seconds  # {"scan": ..., "hash": ..., "transfer": ..., "code": ..., "write": ...}

Library code marks its stages with `stage(name)`; outside `recording` (in this thread) that costs one
context-variable read. While recording, the devices are waited for at each stage's start and end, so
that asynchronous GPU work is counted in the stage that queued it: the stages add up, and the whole is a
little slower than unrecorded. Work on other threads inside a stage counts in that stage.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_CURRENT: ContextVar[dict[str, float] | None] = ContextVar("delta_stages", default=None)


def _wait_for_devices() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Seconds per stage of what this thread runs inside the block (added up when a stage repeats)."""
    seconds: dict[str, float] = defaultdict(float)
    token = _CURRENT.set(seconds)
    try:
        yield seconds
    finally:
        _CURRENT.reset(token)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Count the block's time under `name` when recording."""
    seconds = _CURRENT.get()
    if seconds is None:
        yield
        return
    _wait_for_devices()
    start = time.perf_counter()
    try:
        yield
    finally:
        _wait_for_devices()
        seconds[name] += time.perf_counter() - start
