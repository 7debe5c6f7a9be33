"""Publishing from 1 rank and from 2 ranks on the same state, in one run: time per version and peak
extra memory per rank.

    python -m bench.sharded --elements 30000000 --versions 8

Each rank is a process pinned to its own core (1 rank: core 0; 2 ranks: cores 0 and 1) with one coding
thread (`PublisherConfig(workers=1)`), publishing to a local folder. Every rank holds the whole state
and steps it the same way (fp32 master weights moved by torch's AdamW on seeded random gradients,
published as bf16), as replicated ranks (MULTI_CPU) do; with 2 ranks each publishes its share
(`delta.pieces.split`), so the two runs publish the same versions. Per version: seconds from the
snapshot to the commit (`PublishedVersion.seconds`, the slowest rank), the CPU seconds the busiest
rank spent from `publish` to the commit (all its threads: what the wall time would be on an idle
core, less the waits), and the seconds `publish` blocked the step (`copy_s`). Peak extra memory: resident memory sampled
every 2 ms from `publish` to the commit, minus what it was just before `publish`, over the delta versions, next to the
rank's share of the published bytes. The anchor (version 1) and the first delta (thread pools and codec
tables start) are warm-up, left out of both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from delta import Publisher, PublisherConfig, pieces

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _PeakRss:
    """Samples this process's resident memory in a thread; `peak` is the highest seen."""

    def __init__(self, interval: float = 0.002) -> None:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss())


def _shapes(elements: int) -> dict[str, tuple[int, int]]:
    """Eight matrices of 1024 columns, `elements` in all (roughly)."""
    rows = max(2, elements // (8 * 1024))
    return {f"layers.{i}.weight": (rows, 1024) for i in range(8)}


def _rank(rank: int, world: int, rendezvous: str, elements: int, versions: int, bucket: str, queue) -> None:
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
        )
    g = torch.Generator().manual_seed(0)
    master = {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.02) for n, s in _shapes(elements).items()}
    optimizer = torch.optim.AdamW(master.values(), lr=1e-5)
    published = {n: p.detach().bfloat16() for n, p in master.items()}
    share = pieces.flatten(pieces.split(published, rank, world))[0]
    share_bytes = sum(t.numel() * t.element_size() for t in share.values())
    rows = []
    with Publisher(bucket, PublisherConfig(anchor_every=1000, workers=1, commit_timeout=600)) as pub:
        for version in range(1, versions + 1):
            for i, p in enumerate(master.values()):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(version * 100 + i))
            optimizer.step()
            for n, p in master.items():
                published[n].copy_(p.detach())
            before, cpu = _rss(), time.process_time()
            sampler = _PeakRss()
            pub.publish(pieces.split(published, rank, world) if world > 1 else published)
            pub.flush()
            cpu = time.process_time() - cpu
            peak = sampler.stop()
            assert pub.last is not None  # flushed
            rows.append(
                {
                    "version": version,
                    "kind": pub.last.kind,
                    "seconds": pub.last.seconds,
                    "cpu_s": cpu,
                    "copy_s": pub.copy_s,
                    "extra_bytes": peak - before,
                    "bytes": pub.last.bytes_written,
                }
            )
    queue.put({"rank": rank, "share_bytes": share_bytes, "rows": rows})
    if world > 1:
        dist.destroy_process_group()


def run(world: int, elements: int, versions: int) -> dict:
    """Publish `versions` versions with `world` ranks; per-version figures, slowest rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        bucket, rendezvous = os.path.join(tmp, "bucket"), os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_rank, args=(r, world, rendezvous, elements, versions, bucket, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results = sorted((queue.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"a rank of the {world}-rank run exited with {p.exitcode}")
    deltas = [i for i, row in enumerate(results[0]["rows"]) if row["kind"] == "delta"][1:]  # first one: warm-up
    per_version = [max(r["rows"][i]["seconds"] for r in results) for i in deltas]
    return {
        "ranks": world,
        "publish_s_median": statistics.median(per_version),
        "publish_s": [round(s, 3) for s in per_version],
        "cpu_s_median": statistics.median(max(r["rows"][i]["cpu_s"] for r in results) for i in deltas),
        "copy_s_median": statistics.median(max(r["rows"][i]["copy_s"] for r in results) for i in deltas),
        "anchor_s": max(r["rows"][0]["seconds"] for r in results),
        "share_bytes": [r["share_bytes"] for r in results],
        "peak_extra_bytes": [max(r["rows"][i]["extra_bytes"] for i in deltas) for r in results],
        "delta_bytes_median": statistics.median(sum(r["rows"][i]["bytes"] for r in results) for i in deltas),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=30_000_000, help="bf16 elements in the published state")
    parser.add_argument("--versions", type=int, default=8, help="versions per run (the first two are warm-up)")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"state {args.elements / 1e6:.0f} M bf16 elements; each rank pinned to one core, one coding thread; "
        f"load average {load}"
    )
    results = [run(world, args.elements, args.versions) for world in (1, 2)]
    print("load average (1, 5, 15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    one, two = results
    for r in results:
        share = max(r["share_bytes"])
        print(
            f"{r['ranks']} rank(s): publish per delta version {r['publish_s_median']:.3f} s (median of "
            f"{r['publish_s']}), CPU time of the busiest rank {r['cpu_s_median']:.3f} s, publish() blocked "
            f"{r['copy_s_median'] * 1e3:.1f} ms, anchor {r['anchor_s']:.2f} s; "
            f"share {share / 2**20:.0f} MiB per rank, peak extra memory "
            f"{[round(b / 2**20) for b in r['peak_extra_bytes']]} MiB "
            f"({max(r['peak_extra_bytes']) / share:.2f}x the share); delta {r['delta_bytes_median'] / 2**20:.2f} MiB"
        )
    print(
        f"2 ranks / 1 rank per version: publish time {two['publish_s_median'] / one['publish_s_median']:.2f}, "
        f"CPU time of the busiest rank {two['cpu_s_median'] / one['cpu_s_median']:.2f}"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
