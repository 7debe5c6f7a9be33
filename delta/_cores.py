"""How many threads the compiled host code runs on by default: shared by every layer."""

from __future__ import annotations

import os


def default_workers() -> int:
    """Threads for coding and hashing: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
