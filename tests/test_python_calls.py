"""The host's share of a diff and an apply runs in compiled calls, not in Python per chunk: the Python-level calls
of one diff and one apply are the same for a state and for one 8x larger (8x the chunks), for every codec, on the
host path and on the device path forced onto CPU tensors.

Calls are counted with `sys.setprofile`/`threading.setprofile` on every thread (the kept worker threads are ended
first, so that the profile is set in the ones the diff starts); the thread machinery's own calls (waiting on locks
and queues, which varies with timing) are left out, not the work it runs, and so are the typed lists each thread
makes for itself once (`PerThread`): how many threads take a share varies with timing, not with chunks.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import sys
import threading
import weakref
from collections import Counter

import numpy as np
import pytest
import torch

import delta
from delta import _cores
from delta.tensors import _device

from ._states import clone, states_equal

_PER_THREAD_SETUP = _cores.PerThread._made.__code__
_MACHINERY = tuple(os.path.dirname(m.__file__) if m is concurrent.futures else m.__file__.removesuffix("c")
                   for m in (threading, queue, weakref, concurrent.futures))


class Calls:
    """Python function calls and calls of C functions from Python, by function, on every thread."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._setup = threading.local()  # depth inside a thread's one-time set-up (left out)

    def _profile(self, frame, event, arg) -> None:
        code = frame.f_code
        if code is _PER_THREAD_SETUP:
            self._setup.depth = getattr(self._setup, "depth", 0) + (1 if event == "call" else -1 if event == "return"
                                                                     else 0)
            return
        if event not in ("call", "c_call") or getattr(self._setup, "depth", 0):
            return
        if code.co_filename.startswith(_MACHINERY):
            return
        name = getattr(arg, "__qualname__", repr(arg)) if event == "c_call" else code.co_qualname
        self.seen.append(f"{os.path.basename(code.co_filename)}:{name}")  # list.append: atomic under the GIL

    def __enter__(self) -> Calls:
        _cores.stop_threads()
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    @property
    def counts(self) -> Counter:
        return Counter(self.seen)


def _state(n: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A bf16 and an fp32 tensor whose old values take three exponents, every chunk of 500 elements with changes
    in all three (so the models, one per class, are the same at any size), and ~5 % changed by a few ULPs."""
    rng = np.random.default_rng(n)
    old, new = {}, {}
    for name, dtype, size in (("w", torch.bfloat16, n), ("b", torch.float32, n // 8)):
        base = torch.from_numpy(rng.choice([0.3, -0.6, 1.2], size)).to(dtype)
        step = torch.from_numpy(rng.integers(-3, 4, size) * (rng.random(size) < 0.05))
        view = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
        old[name] = base
        new[name] = (base.view(view).to(torch.int64) + step).to(view).view(dtype)
    return old, new


def _calls(codec: str, n: int, chunk: int) -> tuple[Counter, Counter]:
    old, new = _state(n)
    digest = delta.state_digest(old)
    with Calls() as diff_calls:
        data = delta.diff(old, new, codec=codec, old_digest=digest, chunk=chunk, workers=2)
    state = clone(old)
    with Calls() as apply_calls:
        delta.apply(state, data, digest=digest, workers=2)
    assert states_equal(state, new)
    return diff_calls.counts, apply_calls.counts


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device-on-cpu"])
@pytest.mark.parametrize("codec", ["ctx", "gap", "raw"])
def test_python_calls_do_not_grow_with_chunks(codec: str, device_path: bool, monkeypatch) -> None:
    monkeypatch.setattr(_device, "DEVICE_PATH", device_path)
    _calls(codec, 4000, 500)  # compiled code loaded, pools filled
    _device.POOL.clear()
    small = _calls(codec, 64_000, 500)  # 128 + 16 chunks: as many ranges of chunks as 2 threads take (8) or more
    _device.POOL.clear()
    large = _calls(codec, 512_000, 500)  # 1024 + 128 chunks
    for what, a, b in zip(("diff", "apply"), small, large):
        grown = {k: (a[k], b[k]) for k in set(a) | set(b) if a[k] != b[k]}
        assert not grown, f"{what}: calls that grew with 8x the chunks (small, large): {grown}"
    assert sum(small[0].values()) < 10_000 and sum(small[1].values()) < 10_000  # a few thousand: per tensor, per thread
