"""Publish-to-reader benchmark on a Qwen3-0.6B-shaped bf16 state (~600M elements, ~1% changed per step).

    python -m bench.sync [--data /work/data/qwen3-0.6b-shape] [--anchor-every 50]

Prints, in one run: the trainer-visible blocking time of `Publisher.publish` next to an in-memory
copy of the state (goal <= 1.5x); the time from `publish` to a following `Subscriber` holding the new
state, on a local bucket and on a `rclone serve s3` server on 127.0.0.1 (goal <= 1 s local); bytes
written per version including manifests and anchors, amortised over the anchor interval.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from delta import Publisher, PublisherConfig, Subscriber, SubscriberConfig, load_state, read_manifest

from ._files import step_file_name


def _copy_time(state: dict[str, torch.Tensor], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        copy = {k: v.clone() for k, v in state.items()}
        best = min(best, time.perf_counter() - start)
        del copy
    return best


def _run(label: str, url: str, states: list[dict[str, torch.Tensor]], anchor_every: int, **options) -> dict:
    """Publish states[0] (anchor), then each later state with a subscriber following; time everything."""
    config = PublisherConfig(anchor_every=anchor_every)
    reader = Subscriber(url, config=SubscriberConfig(poll_interval=0.01, max_backoff=0.5), **options)
    blocking, latency, pauses = [], [], []
    with Publisher(url, config, **options) as pub:
        pub.publish(states[0])
        pub.flush()
        reader.sync()
        reader.start()
        for version, state in enumerate(states[1:], start=2):
            start = time.perf_counter()
            pub.publish(state)
            blocking.append(time.perf_counter() - start)
            if not reader.wait_for(version, timeout=300):
                raise RuntimeError(f"{label}: reader did not reach version {version}: {reader.status()}")
            latency.append(time.perf_counter() - start)
            pauses.append(reader.status().history[-1].apply_pause_s)
        pub.flush()
    reader.close()
    manifest = read_manifest(url, **options)
    assert manifest is not None  # published above
    deltas = [v.delta_bytes for v in manifest.versions[1:]]
    return dict(
        label=label,
        blocking=blocking,
        latency=latency,
        pauses=pauses,
        anchor=manifest.versions[0].anchor_bytes,
        delta=sum(deltas) / len(deltas),
        manifest=len(manifest.to_json()),
        history=reader.status().history,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/work/data/qwen3-0.6b-shape", help="bench.checkpoints output folder")
    parser.add_argument("--anchor-every", type=int, default=50)
    parser.add_argument("--skip-s3", action="store_true", help="local bucket only")
    args = parser.parse_args(argv)

    files = sorted(p for p in os.listdir(args.data) if p.endswith(".safetensors"))
    states = [
        load_state(os.path.join(args.data, f)) for f in files if f in {step_file_name(i) for i in range(len(files))}
    ]
    numel = sum(t.numel() for t in states[0].values())
    print(
        f"measured on: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), python {platform.python_version()}; load from other processes "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"state: {args.data}, {len(states)} states, {numel:,} elements, "
        f"{sum(t.numel() * t.element_size() for t in states[0].values()) / 1e9:.2f} GB"
    )
    copy_s = _copy_time(states[0])

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        results.append(_run("local", str(Path(tmp) / "bucket"), states, args.anchor_every))
        if not args.skip_s3:
            from tests.rclone_server import RcloneS3Server

            with RcloneS3Server(Path(tmp) / "s3") as server:
                results.append(
                    _run("rclone-s3", "s3://bench/run", states, args.anchor_every, **server.storage_options())
                )

    print(f"in-memory copy of the state (clone): {copy_s * 1e3:.0f} ms")
    for r in results:
        block = max(r["blocking"])
        print(
            f"[{r['label']}] publish() blocking: "
            + ", ".join(f"{b * 1e3:.0f} ms" for b in r["blocking"])
            + f"  -> worst {block / copy_s:.2f}x the copy (goal <= 1.5x)"
        )
        print(
            f"[{r['label']}] publish -> reader holds the new state: "
            + ", ".join(f"{t:.2f} s" for t in r["latency"])
            + "  (goal <= 1 s local); reader apply pause: "
            + ", ".join(f"{p * 1e3:.0f} ms" for p in r["pauses"])
        )
        for h in r["history"]:
            print(
                f"[{r['label']}]   version {h.version} via {h.via}: fetched {h.bytes_fetched:,} B in "
                f"{h.fetch_s:.2f} s, decode {h.decode_s:.2f} s, apply pause {h.apply_pause_s * 1e3:.0f} ms"
            )
        amortised = r["delta"] + r["manifest"] + r["anchor"] / args.anchor_every
        print(
            f"[{r['label']}] bytes per version: delta {r['delta']:,.0f} + manifest {r['manifest']:,} + anchor "
            f"{r['anchor']:,} / {args.anchor_every} = {amortised:,.0f} B amortised "
            f"({amortised / numel * 8:.3f} bits per element, {100 * amortised / (2 * numel):.2f}% of a full bf16 copy)"
        )


if __name__ == "__main__":
    main()
