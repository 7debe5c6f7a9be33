"""This checkout's `delta` against another checkout's, in one process, interleaved: did a change make the
CPU path slower?

    python -m bench.ab --base /path/to/other/checkout --data /path/to/bench.checkpoints/output [--rounds 3]

Loads the other checkout's `delta` package under another name, then, round after round and one
implementation after the other on the same states: `Publisher.publish` blocking time, the writer's
time per version (publish to commit, `flush`), and `delta.apply` time per version (decode + write).
Prints the best of the rounds for each version, and the ratio of the fastest of each side (the figure
least touched by other processes), then the bytes of each version's delta on both sides and their ratio. Interleaving in
one process spreads the load of other processes over both sides alike, which a run of `bench.sync` per checkout does
not.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

import delta
from delta import load_state

from ._files import step_file_name


def _load_package(checkout: str, alias: str) -> ModuleType:
    """The `delta` package of `checkout`, imported as `alias` (its imports are relative)."""
    spec = importlib.util.spec_from_file_location(
        alias,
        os.path.join(checkout, "delta", "__init__.py"),
        submodule_search_locations=[os.path.join(checkout, "delta")],
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"no delta package in {checkout}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


def _one_round(
    lib: ModuleType, states: list[dict[str, torch.Tensor]], folder: str
) -> tuple[dict[str, list[float]], list[int]]:
    """Publish every state (flushing each), then apply each delta to a copy of the first state; returns the
    times and the bytes of each version's delta."""
    blocking, writer, apply_s = [], [], []
    with lib.Publisher(folder, lib.PublisherConfig(anchor_every=1000)) as pub:
        pub.publish(states[0])
        pub.flush()
        for state in states[1:]:
            start = time.perf_counter()
            pub.publish(state)
            blocking.append(time.perf_counter() - start)
            pub.flush()
            writer.append(time.perf_counter() - start)
    storage = lib.open_storage(folder)
    manifest = lib.read_manifest(storage)
    reader = {k: v.clone() for k, v in states[0].items()}
    digest = None
    sizes = [sum(f.size for f in entry.delta) for entry in manifest.versions[1:]]
    for entry in manifest.versions[1:]:
        data = storage.read(entry.delta[0].path)
        start = time.perf_counter()
        digest = lib.apply(reader, data, digest=digest).digest
        apply_s.append(time.perf_counter() - start)
    return {"publish() blocking": blocking, "writer per version": writer, "apply per version": apply_s}, sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout (its delta/ is measured as the baseline)")
    parser.add_argument("--data", required=True, help="bench.checkpoints output folder")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    base = _load_package(args.base, "delta_base")
    files = sorted(f for f in os.listdir(args.data) if f.endswith(".safetensors"))
    steps = {step_file_name(i) for i in range(len(files))}
    states = [load_state(os.path.join(args.data, f)) for f in files if f in steps]
    print(
        f"measured on: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, python "
        f"{platform.python_version()}; load from other processes {os.getloadavg()[0]:.1f}"
    )
    print(
        f"state: {args.data}, {len(states)} states, {sum(t.numel() for t in states[0].values()):,} elements; "
        f"{args.rounds} rounds, the two implementations alternating"
    )
    best: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    sizes: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        for r in range(args.rounds):
            for name, lib in (("base", base), ("this", delta)) if r % 2 == 0 else (("this", delta), ("base", base)):
                got, sizes[name] = _one_round(lib, states, str(Path(tmp) / f"{name}-{r}"))
                for metric, values in got.items():
                    old = best[name].get(metric)
                    best[name][metric] = (
                        values if old is None else [min(a, b) for a, b in zip(old, values, strict=True)]
                    )
    for metric in best["this"]:
        b, t = best["base"][metric], best["this"][metric]
        print(
            f"{metric} (best of {args.rounds} per version): base {', '.join(f'{x * 1e3:.0f}' for x in b)} ms; this "
            f"{', '.join(f'{x * 1e3:.0f}' for x in t)} ms; fastest this/base {min(t) / min(b):.2f}x"
        )
    print(
        f"bytes per delta: base {', '.join(f'{n:,}' for n in sizes['base'])}; this "
        f"{', '.join(f'{n:,}' for n in sizes['this'])}; this/base {sum(sizes['this']) / sum(sizes['base']):.4f}"
    )


if __name__ == "__main__":
    main()
