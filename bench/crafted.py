"""Crafted deltas against a good one, measured in one run: what refusing a hostile file costs a reader.

    python -m bench.crafted                                   # a 135M-element base (SmolLM2-135M-sized), best of 3
    python -m bench.crafted --elements 20_000_000 --repeat 1  # quick
    python -m bench.crafted --only dense --repeat 7           # some cases (the floor and `good ctx` always)

Every case runs `python -m delta apply BASE FILE -o OUT` in a fresh process, interleaved, best of --repeat; the
process reports its peak resident memory and wall time. `floor` loads the base and exits; `good ctx` applies the good
delta (1 % of the elements moved one ULP); every crafted case must be refused (exit 1, one line): headers at and over
the limit or nested deep, repeated entries, a zstd bomb and the largest models stream, a dense delta with a forged
target, chunks claiming every element, garbage words. The base: bf16 matrices scaled to --elements, plus small fp32,
fp64 and fp8 tensors.

A white-box tool: it forges files from `delta`'s internals (the codecs' streams, the rANS coder, the header limit),
as the test suite's forger does."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import pairwise

import numpy as np
import torch
import zstandard

import delta
from delta.codecs import _rans
from delta.codecs._streams import pack, unpack
from delta.format import header_limit
from delta.tensors.bits import DTYPES_BY_NAME, bits, layout_of
from tests._forgery import Raw, deep, forge_duplicate, join, split  # the test suite's forger, shared

CHILD = r"""
import json, sys, time
start = time.perf_counter()
from delta import load_state
from delta.cli import main
args = json.loads(sys.argv[1])
if args[0] == "floor":
    load_state(args[1])
    rc = 0
else:
    rc = main(args)
seconds = time.perf_counter() - start
with open("/proc/self/status") as f:  # VmHWM: this process's peak resident set (ru_maxrss keeps the parent's)
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"rc": rc, "seconds": seconds, "peak_mb": peak / 1024}))
"""


def base_state(elements: int) -> dict[str, torch.Tensor]:
    """bf16 matrices in a transformer's proportions (~`elements` in all), fp32 norms, one fp64 and one fp8 tensor."""
    g = torch.Generator().manual_seed(0)
    hidden = 576
    per_layer = 12 * hidden * hidden
    layers = max(1, elements // per_layer)
    state = {}
    for i in range(layers):
        for name, shape in (
            ("q", (hidden, hidden)),
            ("k", (hidden // 3, hidden)),
            ("v", (hidden // 3, hidden)),
            ("o", (hidden, hidden)),
            ("gate", (4 * hidden, hidden)),
            ("up", (4 * hidden, hidden)),
            ("down", (hidden, 4 * hidden)),
        ):
            state[f"layers.{i:02d}.{name}.weight"] = (torch.randn(shape, generator=g) * 0.02).bfloat16()
        state[f"layers.{i:02d}.norm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    state["scale.f64"] = torch.randn(4096, generator=g, dtype=torch.float64)
    state["scale.f8"] = torch.randn(4096, generator=g).to(torch.float8_e4m3fn)
    return state


def moved(state: dict[str, torch.Tensor], density: float, seed: int) -> dict[str, torch.Tensor]:
    """`state` with a `density` of each tensor's elements moved by one ULP (bit pattern +1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in state.items():
        t = t.clone()
        flat = bits(t)
        picks = rng.random(flat.size) < density
        flat[picks] += flat.dtype.type(1)
        out[name] = t
    return out


def models_max(good: bytes, state: dict[str, torch.Tensor]) -> bytes:
    """The dense claim below, with every chunk row spanning all classes of its dtype and the models stream as
    large as the reader then allows: every model its rows admit, each over the whole alphabet."""
    p = split(dense_claim(good, state))
    assert p.meta is not None  # a delta file's header has its metadata
    rows = unpack(p.blobs["chunks"][2], np.uint32, None, "chunks", 1 << 30).copy()
    table = rows[1:].reshape(-1, 5)
    classes: dict[int, int] = {}
    at = 0
    for e in json.loads(p.meta["tensors"]):
        layout = layout_of(DTYPES_BY_NAME[e["dtype"]])
        held = 0
        while held < e["changed"]:
            table[at, 3], table[at, 4] = 0, layout.mask
            held += int(table[at, 1])
            at += 1
        classes[layout.itemsize * 8] = max(classes.get(layout.itemsize * 8, 0), layout.mask + 1)
    largest: dict[int, int] = {}
    for e in json.loads(p.meta["tensors"]):
        width = layout_of(DTYPES_BY_NAME[e["dtype"]]).itemsize * 8
        largest[width] = max(largest.get(width, 0), min(1 << 20, int(np.prod(e["shape"]))))
    models = []
    for width in sorted(classes):
        for kind in (0, 1):
            top = _rans.symbol_of(largest[width] - 1 if kind == 0 else (1 << width) - 2)  # the reader's bound
            symbols = list(range(top + 1)) + ([_rans.END] if kind == 0 else [])
            freq = [_rans.PROB_SCALE // len(symbols)] * len(symbols)
            freq[0] += _rans.PROB_SCALE - sum(freq)
            diffs = [symbols[0]] + [b - a for a, b in pairwise(symbols)]
            pairs = [v for pair in zip(diffs, freq, strict=True) for v in pair]
            for c in range(classes[width]):
                models.append([kind, width, c, len(symbols)] + pairs)
    models.sort(key=lambda m: tuple(m[:3]))
    p.blobs["chunks"][2] = pack(rows)
    p.blobs["chunks"][1] = [len(p.blobs["chunks"][2])]
    p.blobs["models"][2] = pack(np.asarray([v for m in models for v in m], np.uint32))
    p.blobs["models"][1] = [len(p.blobs["models"][2])]
    return join(p)


def dense_claim(good: bytes, state: dict[str, torch.Tensor]) -> bytes:
    """Every tensor claims every element changed, each chunk in 2 words, with one-symbol models (a symbol that
    costs no bits: the decoder runs through the whole claim before it finds the stream wrong)."""
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    table = json.loads(p.meta["tensors"])
    chunk = 1 << 20
    rows, keys = [chunk], set()
    for e in table:
        n = int(np.prod(e["shape"]))
        e["changed"] = n
        dtype = DTYPES_BY_NAME[e["dtype"]]
        layout = layout_of(dtype)
        c = 126 if layout.mask >= 126 else 0
        for k in range(-(-n // chunk)):
            rows += [k, min(chunk, n - k * chunk), 2, c, c]
        keys |= {(0, layout.itemsize * 8, c), (1, layout.itemsize * 8, c)}
    p.meta["tensors"] = json.dumps(table, separators=(",", ":"))
    p.meta["changed"] = str(sum(e["changed"] for e in table))
    models = []
    for kind, width, c in sorted(keys):
        models += [kind, width, c, 1, 0, _rans.PROB_SCALE]
    words = np.zeros(2 * (len(rows) - 1) // 5, "<u2")
    words[0::2] = 1  # state 2**16: the initial state, in range
    for name, data in (("chunks", np.asarray(rows, np.uint32)), ("models", np.asarray(models, np.uint32))):
        p.blobs[name][2] = pack(data)
        p.blobs[name][1] = [len(p.blobs[name][2])]
    p.blobs["words"][2], p.blobs["words"][1] = words.tobytes(), [words.nbytes]
    return join(p)


def header_at_limit(good: bytes, limit: int) -> bytes:
    """The good header plus a list of two-letter strings (the costliest JSON values per byte) up to the limit."""
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    room = (limit - int.from_bytes(good[:8], "little") - 16) // 5
    p.extra["x"] = Raw("[" + ",".join(['"ab"'] * room) + "]")
    data = join(p)
    assert int.from_bytes(data[:8], "little") <= limit, (int.from_bytes(data[:8], "little"), limit)
    return data


def entry_repeated(good: bytes, limit: int) -> bytes:
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    table = json.loads(p.meta["tensors"])
    row = max(table, key=lambda e: e["changed"])
    k = max(2, (limit - int.from_bytes(good[:8], "little")) // (len(json.dumps(json.dumps(row))) + 2))
    p.meta["tensors"] = json.dumps(sorted([row] * k + [e for e in table if e is not row], key=lambda e: e["name"]))
    return join(p)


def make_cases(base: dict, folder: str) -> dict[str, str]:
    """Write the good deltas and the crafted files; returns case name -> path."""
    new = moved(base, 0.01, seed=1)
    files: dict[str, bytes] = {}
    for codec in ("ctx", "gap", "raw"):
        files[f"good {codec}"] = delta.diff(base, new, codec=codec, version=2, base_version=1)
    good = files["good ctx"]
    limit = header_limit(base)
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    p.extra["padding"] = "x" * (100 << 20)
    files["header 100 MiB"] = join(p)
    files["header at limit"] = header_at_limit(good, limit)
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    p.extra["x"] = Raw(deep(1000))
    files["nested 1000 deep"] = join(p)
    big = max((n for n in base if base[n].dtype == torch.bfloat16), key=lambda n: base[n].numel())
    files["entry twice"] = forge_duplicate(base, new, big, "ctx")
    files["entry x K"] = entry_repeated(good, limit)
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    p.blobs["models"][2] = zstandard.ZstdCompressor(level=19).compress(bytes(256 << 20))
    p.blobs["models"][1] = [len(p.blobs["models"][2])]
    files["models bomb"] = join(p)
    files["models max"] = models_max(good, base)
    everywhere = moved(base, 1.0, seed=2)
    dense = split(delta.diff(base, everywhere, version=2, base_version=1))
    assert dense.meta is not None  # a delta file's header has its metadata
    dense.meta["target_hash"] = delta.state_digest(new).hexdigest
    files["dense, wrong target"] = join(dense)
    files["dense claim, 2 words per chunk"] = dense_claim(good, base)
    p = split(good)
    assert p.meta is not None  # a delta file's header has its metadata
    p.blobs["words"][2] = np.random.default_rng(0).integers(0, 256, len(p.blobs["words"][2]), np.uint8).tobytes()
    files["garbage words"] = join(p)
    paths = {}
    for name, data in files.items():
        paths[name] = os.path.join(folder, name.replace(" ", "_").replace(",", "") + ".delta")
        with open(paths[name], "wb") as f:
            f.write(data)
    return paths


def run_child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, timeout=1800)
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"child failed: {out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    result["error"] = out.stderr.strip()[:160]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=135_000_000, help="elements in the base (default 135M)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--folder", default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="measure only the cases whose names contain one of these (the floor and `good ctx` always)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        base = base_state(args.elements)
        base_path = os.path.join(folder, "base.safetensors")
        delta.save_state(base, base_path)
        elements = sum(t.numel() for t in base.values())
        state_mb = sum(t.numel() * t.element_size() for t in base.values()) / 2**20
        print(
            f"base: {len(base)} tensors, {elements:,} elements, {state_mb:.0f} MiB; header limit "
            f"{header_limit(base):,} bytes",
            flush=True,
        )
        t0 = time.perf_counter()
        paths = make_cases(base, folder)
        del base
        print(f"wrote {len(paths)} files in {time.perf_counter() - t0:.0f} s", flush=True)
        cases = {"floor": ["floor", base_path]}
        for name, path in paths.items():
            if args.only is None or name == "good ctx" or any(word in name for word in args.only):
                cases[name] = ["apply", base_path, path, "-o", os.path.join(folder, "out.safetensors")]
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, cmd in cases.items():
                r = run_child(cmd)
                if os.path.exists(os.path.join(folder, "out.safetensors")):
                    os.remove(os.path.join(folder, "out.safetensors"))
                b = best.setdefault(name, r)
                b["seconds"], b["peak_mb"] = min(b["seconds"], r["seconds"]), min(b["peak_mb"], r["peak_mb"])
        ref = best["good ctx"]
        print(
            f"\n{'case':<32} {'file MB':>9} {'exit':>5} {'peak MiB':>9} {'x good':>7} {'seconds':>8} {'x good':>7}  "
            "refused with"
        )
        for name, r in best.items():
            size = os.path.getsize(paths[name]) / 1e6 if name in paths else 0
            print(
                f"{name:<32} {size:>9.2f} {r['rc']:>5} {r['peak_mb']:>9.0f} {r['peak_mb'] / ref['peak_mb']:>7.2f} "
                f"{r['seconds']:>8.2f} {r['seconds'] / ref['seconds']:>7.2f}  {r['error'][:90]}"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"elements": elements, "state_mib": state_mb, "cpus": os.cpu_count(), "cases": best}, f, indent=1
                )


if __name__ == "__main__":
    main()
