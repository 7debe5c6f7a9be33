"""Codec benchmark: size and speed of the codecs against their baselines, measured in the same run.

    python -m bench.codec                                   # real AdamW pairs (generated once, cached)
    python -m bench.codec --data smollm2-fp32master --threads 1 2
    python -m bench.codec --synthetic qwen3-8b --layers 4   # large shapes, streamed tensor by tensor
    python -m bench.codec --device cuda --synthetic qwen3-8b --paths device   # the GPU's yardstick

Per pair and thread count, interleaved, best of --repeat: an in-place copy of the state; the floor (`old != new` then
`nonzero` where the state lives); the `raw` diff (TRL's layout); the default codec's diff and apply on the device path
(whole-tensor torch work where the state lives) and the host path (compiled chunk scans), as `--paths` says. A second
table splits each path's time by stage (`delta._stages`) with the host's nanoseconds per changed element per thread.
Sizes in bytes per changed element for `raw`, `gap`, `ctx` and the conditional entropy bound; peak extra memory on the
host and the GPU. Synthetic shapes are made and measured one tensor at a time (`_streamed`).

A white-box tool (tests/test_layout.py): it switches `delta.tensors._device.DEVICE_PATH` to run both paths in one
process."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

import delta
from delta import state_digest
from delta._stages import recording
from delta.tensors import _device

from . import _streamed
from .checkpoints import DATASETS, CheckpointParams, generate_checkpoints
from .entropy import conditional_entropy_bits

DEFAULT_STEPS = 4
# The 600M-element state: 1.2 GB per step on disk, so 2 steps; lr 5e-7 puts it at ~1% density.
BIG: dict[str, Any] = {"data": "qwen3-0.6b-shape", "steps": 2, "lr": 5e-7}
SYNTHETIC_LR = 1e-6
ENCODE_STAGES = ("scan", "hash", "transfer", "code", "write")
APPLY_STAGES = ("read", "decode", "transfer", "locate", "hash", "write")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Samples this process's resident memory in a thread (and the GPU allocator's peak): `extra` is
    the host peak above the start, `gpu_extra` the GPU peak above what was allocated at the start."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        if self.gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.gpu_start = torch.cuda.memory_allocated()
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
        self.gpu_extra = torch.cuda.max_memory_allocated() - self.gpu_start if self.gpu else 0

    @property
    def extra(self) -> int:
        return self.peak - self.start


R = TypeVar("R")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], R], device: str) -> tuple[float, R]:
    gc.collect()
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def _floor(old: dict, new: dict) -> None:
    """What any diff must do at least: compare every element and list the changed ones."""
    for k in old:
        a, b = old[k], new[k]
        if a.is_floating_point():
            view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            a, b = a.view(view), b.view(view)
        torch.nonzero(a != b)


class _Path:
    """`with _Path(device=True):` runs `delta` on its device path (or its host path), whatever the state's device."""

    def __init__(self, device: bool) -> None:
        self.device = device

    def __enter__(self) -> None:
        self.saved, _device.DEVICE_PATH = _device.DEVICE_PATH, self.device

    def __exit__(self, *exc) -> None:
        _device.DEVICE_PATH = self.saved


@dataclass
class Row:
    """One measured pair (or, for synthetic shapes, the sum over all tensors of one state)."""

    data: str
    step: int
    device: str
    threads: int
    elements: int
    state_bytes: int
    changed: int
    raw: float
    gap: float
    ctx: float
    entropy: float
    copy_s: float
    floor_s: float
    raw_s: float
    encode_s: float
    apply_s: float
    host_encode_s: float
    host_apply_s: float
    encode_host_extra: int
    apply_host_extra: int
    encode_gpu_extra: int
    encode_stages: dict[str, float] = field(default_factory=dict)
    apply_stages: dict[str, float] = field(default_factory=dict)
    host_encode_stages: dict[str, float] = field(default_factory=dict)
    host_apply_stages: dict[str, float] = field(default_factory=dict)

    def add(self, other: Row) -> Row:
        """Sums of sizes and times; peaks are the largest."""

        def w(a: float, b: float) -> float:  # per-changed-element sizes, weighted by changed elements
            total = self.changed + other.changed
            return (a * self.changed + b * other.changed) / total if total else 0.0

        def stages(a: dict, b: dict) -> dict:
            return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}

        return dataclasses.replace(
            self,
            elements=self.elements + other.elements,
            state_bytes=self.state_bytes + other.state_bytes,
            changed=self.changed + other.changed,
            raw=w(self.raw, other.raw),
            gap=w(self.gap, other.gap),
            ctx=w(self.ctx, other.ctx),
            entropy=math.nan,
            **{
                f: getattr(self, f) + getattr(other, f)
                for f in ("copy_s", "floor_s", "raw_s", "encode_s", "apply_s", "host_encode_s", "host_apply_s")
            },
            encode_host_extra=max(self.encode_host_extra, other.encode_host_extra),
            apply_host_extra=max(self.apply_host_extra, other.apply_host_extra),
            encode_gpu_extra=max(self.encode_gpu_extra, other.encode_gpu_extra),
            encode_stages=stages(self.encode_stages, other.encode_stages),
            apply_stages=stages(self.apply_stages, other.apply_stages),
            host_encode_stages=stages(self.host_encode_stages, other.host_encode_stages),
            host_apply_stages=stages(self.host_apply_stages, other.host_apply_stages),
        )


PATHS = ("device", "host")


def measure_pair(
    name: str,
    step: int,
    old: dict,
    new: dict,
    *,
    threads: int,
    device: str,
    repeat: int,
    entropy: bool = True,
    paths: tuple[str, ...] = PATHS,
) -> Row:
    """All figures for one (old, new) pair on `device` with `threads`, on the `paths` asked for (the other's figures
    are NaN); the states are not modified."""
    torch.set_num_threads(threads)
    need_host = "host" in paths or entropy  # host copies: for the host path and the entropy bound only
    host_old = {k: v.cpu() for k, v in old.items()} if need_host else {}
    host_new = {k: v.cpu() for k, v in new.items()} if need_host else {}
    if device == "cuda":
        old, new = {k: v.cuda() for k, v in old.items()}, {k: v.cuda() for k, v in new.items()}
    elements = sum(t.numel() for t in new.values())
    nbytes = sum(t.numel() * t.element_size() for t in new.values())
    old_digest = state_digest(old)  # the same digest on either path
    on_device = "device" in paths
    with _Path(device=on_device):  # sizes: the same bytes on either path
        src_old, src_new = (old, new) if on_device else (host_old, host_new)
        sizes = {
            codec: len(delta.diff(src_old, src_new, codec=codec, old_digest=old_digest, workers=threads))
            for codec in ("raw", "gap")
        }
    # Filled once untimed, so no timed pass pays for first-touch page faults.
    scratch = {k: v.clone() for k, v in old.items()}
    reader = {k: v.clone() for k, v in old.items()} if on_device else {}
    host_reader = {k: v.clone() for k, v in host_old.items()} if "host" in paths else {}
    best: dict[str, float] = defaultdict(lambda: math.nan)
    encode_extra = apply_extra = gpu_extra = 0
    data = b""

    def keep(key: str, seconds: float) -> None:
        best[key] = seconds if math.isnan(best[key]) else min(best[key], seconds)

    for _ in range(repeat):  # interleaved, so a busy moment of a shared machine hits every figure alike
        keep("copy", _timed(lambda: [scratch[k].copy_(old[k]) for k in old], device)[0])
        keep("floor", _timed(lambda: _floor(old, new), device)[0])
        if on_device:
            with _Path(device=True):
                keep(
                    "raw",
                    _timed(lambda: delta.diff(old, new, codec="raw", old_digest=old_digest, workers=threads), device)[
                        0
                    ],
                )
                with PeakMemory(device == "cuda") as mem:
                    seconds, data = _timed(lambda: delta.diff(old, new, old_digest=old_digest, workers=threads), device)
                keep("encode", seconds)
                gpu_extra = max(gpu_extra, mem.gpu_extra)
                for k in reader:
                    reader[k].copy_(old[k])

                def apply_device(data: bytes = data) -> object:
                    return delta.apply(reader, data, digest=old_digest, workers=threads)

                keep("apply", _timed(apply_device, device)[0])
        if "host" in paths:
            with _Path(device=False):
                if not on_device:
                    keep(
                        "raw",
                        _timed(
                            lambda: delta.diff(host_old, host_new, codec="raw", old_digest=old_digest, workers=threads),
                            "cpu",
                        )[0],
                    )
                with PeakMemory(False) as mem:
                    seconds, host_data = _timed(
                        lambda: delta.diff(host_old, host_new, old_digest=old_digest, workers=threads), "cpu"
                    )
                keep("host_encode", seconds)
                encode_extra = max(encode_extra, mem.extra)
                assert not data or host_data == data, "the device path and the host path wrote different bytes"
                data = host_data
                for k in host_reader:
                    host_reader[k].copy_(host_old[k])

                def apply_host(data: bytes = data) -> object:
                    return delta.apply(host_reader, data, digest=old_digest, workers=threads)

                with PeakMemory(False) as mem:
                    seconds, _ = _timed(apply_host, "cpu")
                keep("host_apply", seconds)
                apply_extra = max(apply_extra, mem.extra)
    stages: dict[str, tuple[dict[str, float], dict[str, float]]] = {
        path: ({}, {}) for path in paths
    }  # where each path's time goes: `repeat` more runs, recorded
    for _ in range(repeat):
        for path in paths:
            src_old, src_new, target = (old, new, reader) if path == "device" else (host_old, host_new, host_reader)
            with _Path(device=path == "device"):
                with recording() as encode_stages:
                    delta.diff(src_old, src_new, old_digest=old_digest, workers=threads)
                for k in target:
                    target[k].copy_(src_old[k])
                with recording() as apply_stages:
                    delta.apply(target, data, digest=old_digest, workers=threads)
            for kept, recorded in zip(stages[path], (encode_stages, apply_stages), strict=True):
                kept.update({k: min(v, kept.get(k, v)) for k, v in recorded.items()})
    header, _ = delta.read_delta(data)
    changed = max(header.changed, 1)
    bound = conditional_entropy_bits(host_old, host_new) / 8 / changed if entropy else math.nan
    none: tuple[dict[str, float], dict[str, float]] = ({}, {})
    return Row(
        data=name,
        step=step,
        device=device,
        threads=threads,
        elements=elements,
        state_bytes=nbytes,
        changed=header.changed,
        raw=sizes["raw"] / changed,
        gap=sizes["gap"] / changed,
        ctx=len(data) / changed,
        entropy=bound,
        copy_s=best["copy"],
        floor_s=best["floor"],
        raw_s=best["raw"],
        encode_s=best["encode"],
        apply_s=best["apply"],
        host_encode_s=best["host_encode"],
        host_apply_s=best["host_apply"],
        encode_host_extra=encode_extra,
        apply_host_extra=apply_extra,
        encode_gpu_extra=gpu_extra,
        encode_stages=stages.get("device", none)[0],
        apply_stages=stages.get("device", none)[1],
        host_encode_stages=stages.get("host", none)[0],
        host_apply_stages=stages.get("host", none)[1],
    )


def render(rows: list[Row]) -> str:
    head = (
        f"{'data':<20} {'step':>4} {'dev':>4} {'thr':>3} {'elements':>14} {'density':>8} | {'raw':>5} {'gap':>6} "
        f"{'ctx':>6} {'bound':>6} {'raw/ctx':>7} | {'copy':>6} {'floor':>6} {'raw':>6} | {'diff':>6} {'apply':>6} "
        f"{'diff/raw':>8} | {'h.diff':>6} {'h.apply':>7} | {'enc host':>8} {'app host':>8} {'enc gpu':>7}"
    )
    lines = [
        (
            "sizes: bytes per changed element | speeds: GB/s of state (bf16 bytes); diff and apply on the device "
            "path, h. on the host path; diff/raw: time of the default diff over the raw diff "
            "| extra memory (host path; GPU): fraction of the state"
        ),
        head,
        "-" * len(head),
    ]
    for r in rows:
        gb = r.state_bytes / 1e9
        lines.append(
            f"{r.data:<20} {r.step:>4} {r.device:>4} {r.threads:>3} {r.elements:>14,} "
            f"{100 * r.changed / r.elements:>7.3f}% | {r.raw:>5.2f} {r.gap:>6.3f} {r.ctx:>6.3f} {r.entropy:>6.3f} "
            f"{r.raw / r.ctx:>7.1f} | {gb / r.copy_s:>6.2f} {gb / r.floor_s:>6.2f} {gb / r.raw_s:>6.2f} | "
            f"{gb / r.encode_s:>6.2f} {gb / r.apply_s:>6.2f} {r.encode_s / r.raw_s:>8.2f} | "
            f"{gb / r.host_encode_s:>6.2f} {gb / r.host_apply_s:>7.2f} | "
            f"{r.encode_host_extra / r.state_bytes:>8.2f} {r.apply_host_extra / r.state_bytes:>8.2f} "
            f"{r.encode_gpu_extra / r.state_bytes:>7.2f}"
        )
    return "\n".join(lines)


def _per_change_core(seconds: float, r: Row) -> str:
    """Host nanoseconds per changed element per core (threads x seconds / changes)."""
    return f"{1e9 * seconds * r.threads / r.changed:>6.1f}" if r.changed and seconds else f"{'-':>6}"


def render_stages(rows: list[Row]) -> str:
    """Milliseconds per stage of each path's diff and apply (best of the recorded runs, per stage: waits at each stage),
    and the host's nanoseconds per change per core for coding (code) and decoding (decode)."""
    lines = [
        (
            "milliseconds per stage (scan: compare, classes, sort, ranks, steps, on the host path also the symbol "
            "counts; hash: the changes' state-hash sums; transfer: host<->device copies; code: symbol counts and rANS "
            "on host threads; decode: rANS on host threads, on the host path also placing; locate: positions and new "
            "values on the device; write: the file, or index_copy_ into the state); ns/ch/core: host nanoseconds per "
            "changed element per thread for code and decode"
        )
    ]
    head = (
        f"{'data':<20} {'step':>4} {'dev':>4} {'path':>6} {'thr':>3} | diff: "
        + " ".join(f"{s:>8}" for s in ENCODE_STAGES)
        + " | apply: "
        + " ".join(f"{s:>8}" for s in APPLY_STAGES)
        + " | ns/ch/core: code decode"
    )
    lines += [head, "-" * len(head)]
    for r in rows:
        for path, (enc, app) in (
            ("device", (r.encode_stages, r.apply_stages)),
            ("host", (r.host_encode_stages, r.host_apply_stages)),
        ):
            if not enc:
                continue
            lines.append(
                f"{r.data:<20} {r.step:>4} {r.device:>4} {path:>6} {r.threads:>3} | diff: "
                + " ".join(f"{1e3 * enc.get(s, 0.0):>8.1f}" for s in ENCODE_STAGES)
                + " | apply: "
                + " ".join(f"{1e3 * app.get(s, 0.0):>8.1f}" for s in APPLY_STAGES)
                + f" | {_per_change_core(enc.get('code', 0.0), r)} {_per_change_core(app.get('decode', 0.0), r)}"
            )
    return "\n".join(lines)


def machine(device: str) -> str:
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    gpu = f", GPU {torch.cuda.get_device_name()}" if device == "cuda" else ""
    return f"{cpu}{gpu}, torch {torch.__version__}, python {platform.python_version()}"


def checkpoint_pairs(names: Iterable[str], steps: int | None, data_dir: str) -> Iterable[tuple[str, int, dict, dict]]:
    """(data set, step, old, new) for consecutive steps of each cached (or freshly generated) run."""
    for name in names:
        params = CheckpointParams(**BIG) if name == BIG["data"] else CheckpointParams(data=name, steps=DEFAULT_STEPS)
        if steps:
            params = dataclasses.replace(params, steps=steps)
        paths = generate_checkpoints(params, os.path.join(data_dir, name)).files
        old = delta.load_state(paths[0])
        for step, path in enumerate(paths[1:], start=1):
            new = delta.load_state(path)
            yield name, step, old, new
            old = new


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        nargs="*",
        default=None,
        choices=sorted(DATASETS),
        help="checkpoint data sets (default: all but tiny-qwen3, unless --synthetic is given)",
    )
    parser.add_argument(
        "--synthetic",
        nargs="*",
        default=[],
        choices=sorted(_streamed.SHAPES),
        help="large shapes made and measured tensor by tensor",
    )
    parser.add_argument("--layers", type=int, default=None, help="synthetic shapes: only the first N layers")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimizer steps per data set (default {DEFAULT_STEPS}, {BIG['steps']} for {BIG['data']})",
    )
    parser.add_argument(
        "--data-dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "delta-sync", "checkpoints"),
        help="where the checkpoint sequences are generated once and reused (default %(default)s)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the states live")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[os.cpu_count() or 1],
        help="coding threads to measure (default: one per core)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats, best kept")
    parser.add_argument(
        "--paths",
        choices=["device", "host", "both"],
        default=None,
        help="which paths to measure (default: device alone for --synthetic on --device cuda, else both)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    names = (
        args.data if args.data is not None else ([] if args.synthetic else [d for d in DATASETS if d != "tiny-qwen3"])
    )
    if args.paths is None:
        args.paths = "device" if args.synthetic and args.device == "cuda" else "both"
    paths = PATHS if args.paths == "both" else (args.paths,)
    print(f"measured on: {machine(args.device)}; paths: {', '.join(paths)}", flush=True)
    rows: list[Row] = []
    for name, step, old, new in checkpoint_pairs(names, args.steps, args.data_dir):
        for threads in args.threads:
            rows.append(
                measure_pair(name, step, old, new, threads=threads, device=args.device, repeat=args.repeat, paths=paths)
            )
            print(render(rows[-1:]).splitlines()[-1], flush=True)
    for model in args.synthetic:
        shapes = _streamed.qwen3_shapes(model, args.layers)
        label = model if args.layers is None else f"{model}/{args.layers}L"
        totals: dict[int, Row] = {}
        for tensor, old_tensor, new_tensor in _streamed.pairs(shapes, SYNTHETIC_LR, device=args.device):
            for threads in args.threads:
                row = measure_pair(
                    label,
                    2,
                    {tensor: old_tensor},
                    {tensor: new_tensor},
                    threads=threads,
                    device=args.device,
                    repeat=args.repeat,
                    entropy=False,
                    paths=paths,
                )
                totals[threads] = totals[threads].add(row) if threads in totals else row
            del old_tensor, new_tensor
        for threads in args.threads:
            rows.append(totals[threads])
            print(render(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(render(rows))
    print()
    print(render_stages(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(args.device), "results": [asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
