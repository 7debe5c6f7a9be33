"""Catch-up planning on big manifests: what a reader pays to parse a manifest and plan its route.

    python -m bench.catchup                              # 1,000 / 2,000 / 3,000 / 8,000 anchor versions
    python -m bench.catchup --anchors 8000 --repeat 5

A manifest of N versions, every one an anchor with a delta from the version before (the worst case for
planning: every anchor is a candidate start), as a publisher writes it: real paths, SHA-256 sums and state
hashes, so its JSON is the size a real one would be (~700 bytes per version). Each size runs in a fresh
process: `Manifest.from_json` (what a Subscriber does at every poll), then `catchup.plan` from an empty
reader and from a reader one version behind, best of --repeat; the process reports its peak resident
memory (VmHWM) above what it held with the file's bytes read (what parsing and planning added). The target (issue 37):
an 8,000-anchor manifest planned in under 0.5 s and 200 MiB.

A white-box tool: it calls the planner itself (`delta.bucket.catchup.plan`), which the public API runs only
inside a `Subscriber`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from delta import FileRef, Manifest, VersionEntry
from delta.bucket.catchup import plan

CHILD = r"""
import json, sys
from bench.catchup import measure
print(json.dumps(measure(sys.argv[1], int(sys.argv[2]))))
"""


def big_manifest(versions: int) -> Manifest:
    """`versions` versions, each an anchor (one shard) with a delta from the one before (none for the first)."""
    entries = []
    for v in range(1, versions + 1):
        folder = f"versions/{v:08d}-1a2b3c4d/"
        delta = (FileRef(f"{folder}delta-r00000.safetensors", 1_500_000, f"{v:064x}"),) if v > 1 else ()
        anchor = (FileRef(f"{folder}anchor-r00000-00000-of-00001.safetensors", 270_000_000, f"{v + 1:064x}"),)
        entries.append(
            VersionEntry(
                v,
                "anchor",
                v - 1 if delta else None,
                f"sum128:{v - 1:032x}" if delta else None,
                f"sum128:{v:032x}",
                delta,
                anchor,
                published_at=1.764e9 + v,
            )
        )
    return Manifest(versions, tuple(entries))


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def measure(path: str, repeat: int) -> dict:
    """Parse and plan the manifest at `path` (in this process: run it in a fresh one)."""
    with open(path, "rb") as f:
        data = f.read()
    versions = len(json.loads(data)["versions"])
    before = _peak_kib()
    parse = plan_empty = plan_behind = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        manifest = Manifest.from_json(data)
        parse = min(parse, time.perf_counter() - start)
        start = time.perf_counter()
        route = plan(manifest, versions)
        plan_empty = min(plan_empty, time.perf_counter() - start)
        start = time.perf_counter()
        behind = plan(manifest, versions, have=versions - 1, have_hash=f"sum128:{versions - 1:032x}")
        plan_behind = min(plan_behind, time.perf_counter() - start)
    assert [(s.entry.version, s.via) for s in route] == [(versions, "anchor")]
    assert [(s.entry.version, s.via) for s in behind] == [(versions, "delta")]
    return {
        "versions": versions,
        "manifest_mb": len(data) / 1e6,
        "parse_s": parse,
        "plan_empty_s": plan_empty,
        "plan_behind_s": plan_behind,
        "peak_mib": (_peak_kib() - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchors", type=int, nargs="+", default=[1000, 2000, 3000, 8000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'anchors':>8} {'manifest':>9} {'parse':>8} {'plan (empty)':>13} {'plan (1 behind)':>16} "
        f"{'peak above start':>17}"
    )
    for n in args.anchors:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            f.write(big_manifest(n).to_json())
            f.flush()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, f.name, str(args.repeat)], capture_output=True, text=True, check=True
            )
        r = json.loads(out.stdout)
        print(
            f"{n:>8,} {r['manifest_mb']:>7.1f}MB {r['parse_s']:>7.3f}s {r['plan_empty_s']:>12.4f}s "
            f"{r['plan_behind_s']:>15.4f}s {r['peak_mib']:>14.0f}MiB"
        )


if __name__ == "__main__":
    main()
