"""Codec benchmark: size and speed of every codec on real checkpoint sequences, against baselines.

    python -m bench.codec                       # all data sets (generated once, cached)
    python -m bench.codec --data random-bf16 --steps 2

For each data set and each consecutive pair of checkpoints it measures, in the same run:
density; bytes per changed element for `raw` (TRL layout), zstd over `raw`, `gap`, `ctx` (default)
and the conditional entropy bound; diff+encode and decode+apply time of `ctx` next to an in-place
copy of the same state (ratios, and GB/s of state); and the peak extra memory of encoding.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass

import torch
import zstandard

import delta
from delta.hashing import state_digest

from .checkpoints import DATASETS, CheckpointParams, generate_checkpoints
from .entropy import conditional_entropy_bits


DEFAULT_STEPS = 4
# The 600M-element state: 1.2 GB per step on disk, so 2 steps; lr 5e-7 puts it at ~1% density.
BIG = {"data": "qwen3-0.6b-shape", "steps": 2, "lr": 5e-7}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Samples this process's resident memory in a thread; `extra` is the peak above the start."""

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.start


def _timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


@dataclass
class PairResult:
    data: str
    step: int
    elements: int
    state_bytes: int
    changed: int
    density: float
    raw: float
    raw_zstd: float
    gap: float
    ctx: float
    entropy: float
    copy_s: float
    encode_s: float
    apply_s: float
    apply_gap_s: float
    encode_extra_bytes: int


def measure_pair(name: str, step: int, old: dict, new: dict, repeat: int) -> PairResult:
    """All figures for one (old, new) pair; the states are not modified."""
    elements = sum(t.numel() for t in new.values())
    nbytes = sum(t.numel() * t.element_size() for t in new.values())
    old_digest = state_digest(old)
    sizes = {}
    for codec in ("raw", "gap"):
        sizes[codec] = delta.diff(old, new, codec=codec, old_digest=old_digest)
    raw_zstd = len(zstandard.ZstdCompressor(level=3).compress(sizes["raw"]))
    with PeakMemory() as mem:
        encode_s, data = _timed(lambda: delta.diff(old, new, old_digest=old_digest), repeat)
    header, _ = delta.read_delta(data)
    changed = max(header.changed, 1)

    scratch = {k: torch.empty_like(v) for k, v in old.items()}
    copy_s, _ = _timed(lambda: [scratch[k].copy_(old[k]) for k in old], repeat)

    def apply_fresh(payload: bytes) -> float:
        for k in old:
            scratch[k].copy_(old[k])
        start = time.perf_counter()
        delta.apply(scratch, payload, digest=old_digest)
        return time.perf_counter() - start

    apply_s = min(apply_fresh(data) for _ in range(repeat))
    apply_gap_s = min(apply_fresh(sizes["gap"]) for _ in range(repeat))
    entropy = conditional_entropy_bits(old, new) / 8
    return PairResult(
        data=name, step=step, elements=elements, state_bytes=nbytes, changed=header.changed,
        density=header.density, raw=len(sizes["raw"]) / changed, raw_zstd=raw_zstd / changed,
        gap=len(sizes["gap"]) / changed, ctx=len(data) / changed, entropy=entropy / changed,
        copy_s=copy_s, encode_s=encode_s, apply_s=apply_s, apply_gap_s=apply_gap_s,
        encode_extra_bytes=mem.extra)


def render(results: list[PairResult]) -> str:
    head = (f"{'data':<20} {'step':>4} {'elements':>12} {'density':>8} | {'raw':>5} {'zstd(raw)':>9} {'gap':>6} "
            f"{'ctx':>6} {'entropy':>7} {'raw/ctx':>7} | {'copy s':>7} {'enc s':>7} {'enc GB/s':>8} {'enc/copy':>8} "
            f"{'apply s':>7} {'app GB/s':>8} {'app/copy':>8} {'gap app GB/s':>12} | {'enc extra':>9}")
    lines = ["bytes per changed element | seconds (best of repeats) | extra memory as a fraction of the state", head,
             "-" * len(head)]
    for r in results:
        gb = r.state_bytes / 1e9
        lines.append(
            f"{r.data:<20} {r.step:>4} {r.elements:>12,} {100 * r.density:>7.3f}% | {r.raw:>5.2f} {r.raw_zstd:>9.2f} "
            f"{r.gap:>6.3f} {r.ctx:>6.3f} {r.entropy:>7.3f} {r.raw / r.ctx:>7.1f} | {r.copy_s:>7.3f} {r.encode_s:>7.3f} "
            f"{gb / r.encode_s:>8.2f} {r.encode_s / r.copy_s:>8.1f} {r.apply_s:>7.3f} {gb / r.apply_s:>8.2f} "
            f"{r.apply_s / r.copy_s:>8.1f} {gb / r.apply_gap_s:>12.2f} | {r.encode_extra_bytes / r.state_bytes:>9.2f}")
    return "\n".join(lines)


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), python {platform.python_version()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="*", default=[d for d in DATASETS if d != "tiny-qwen3"],
                        choices=sorted(DATASETS), help="data sets (default: all but tiny-qwen3)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimizer steps per data set (default {DEFAULT_STEPS}, {BIG['steps']} for {BIG['data']})")
    parser.add_argument("--data-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "delta-sync", "checkpoints"),
                        help="where the checkpoint sequences are generated once and reused (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=2, help="timing repeats, best kept")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    print(f"measured on: {machine()}")
    results = []
    for name in args.data:
        params = CheckpointParams(**BIG) if name == BIG["data"] else CheckpointParams(data=name, steps=DEFAULT_STEPS)
        if args.steps:
            params = dataclasses.replace(params, steps=args.steps)
        paths = generate_checkpoints(params, os.path.join(args.data_dir, name)).files
        states = None
        for step, (a, b) in enumerate(zip(paths, paths[1:]), start=1):
            old = delta.load_state(a) if states is None else states
            new = delta.load_state(b)
            results.append(measure_pair(name, step, old, new, args.repeat))
            print(render(results[-1:]).splitlines()[-1], flush=True)
            states = new
    print()
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "results": [asdict(r) for r in results]}, f, indent=1)


if __name__ == "__main__":
    main()
