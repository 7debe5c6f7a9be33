"""`python -m delta`: diff, apply, inspect and verify delta files; publish, pull, log and gc a bucket.

Every command writes its output atomically (nothing is written on failure) and exits non-zero with
a one-line message on bad input. Bucket commands take a URL (`open_storage`); S3 endpoints and
credentials come from the usual AWS environment variables.
"""

from __future__ import annotations

import argparse
import sys
import time

from .atomic import write_atomic
from .codecs import CODECS, DEFAULT_CODEC
from .errors import DeltaError, printable
from .format import read_delta
from .inspect import check_delta, inspect_delta
from .patch.apply import apply, decode
from .patch.diff import diff
from .tensors.state import load_state, save_state


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def cmd_diff(args: argparse.Namespace) -> int:
    old, new = load_state(args.old), load_state(args.new)
    start = time.perf_counter()
    data = diff(old, new, codec=args.codec, version=args.version, base_version=args.base_version, progress=True)
    write_atomic(args.output, data)
    header, _ = read_delta(data)  # the header alone: no need to decode the streams again
    print(f"wrote {args.output}: {len(data):,} bytes, {header.changed:,} of {header.total:,} elements "
          f"changed ({100 * header.density:.3f}%), {len(data) / max(header.changed, 1):.3f} B/changed, codec "
          f"{args.codec}, {time.perf_counter() - start:.2f} s")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    state = load_state(args.base)
    result = apply(state, args.delta)
    save_state(state, args.output)
    h = result.header
    checked = ("hash" if not h.foreign else "TRL checksum_sha256 matched, hash" if h.checksum
               else "TRL file without hashes, hash")
    print(printable(f"wrote {args.output}: version {h.version}, {result.changed:,} elements changed, "
                    f"{checked} {result.digest.hexdigest}"))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    print(inspect_delta(_read(args.file), path=args.file).render(limit=args.limit))  # render escapes what it shows
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    data = _read(args.file)
    if args.base is None:
        _, what = check_delta(data, path=args.file)
        print(printable(f"OK {args.file}: {what}"))
        return 0
    state = load_state(args.base)
    header, _, _ = decode(data, state, path=args.file)  # everything, the target hash proven; nothing written
    if not header.foreign:
        print(printable(f"OK {args.file}: applies to {args.base} and gives {header.target_hash} (base hash, every "
                        "stream and value, and the target hash checked)"))
    else:
        what = "its checksum_sha256 matched" if header.checksum else "the file carries no hashes"
        print(printable(f"OK {args.file}: applies to {args.base} (TRL file: names, dtypes, shapes and positions "
                        f"checked; {what})"))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from .bucket.publish import Publisher, PublisherConfig

    state = load_state(args.state)
    config = PublisherConfig(anchor_every=args.anchor_every, keep_anchors=args.keep_anchors)
    with Publisher(args.bucket, config) as publisher:
        publisher.publish(state, anchor=args.anchor)
        publisher.flush()
    last = publisher.last
    print(f"published version {last.version} ({last.kind}) to {args.bucket}: {last.bytes_written:,} bytes, "
          f"state {last.state_hash}")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .bucket.subscribe import Subscriber

    with Subscriber(args.bucket) as subscriber:
        version = subscriber.sync(args.version)
    if version is None:
        print(f"error: {args.bucket} holds no version yet", file=sys.stderr)
        return 1
    save_state(subscriber.state, args.output, metadata={"version": str(version),
                                                        "state_hash": subscriber.digest.hexdigest})
    print(f"wrote {args.output}: version {version}, state {subscriber.digest.hexdigest} (verified)")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from .bucket.manifest import read_manifest
    from .storage import open_storage

    manifest = read_manifest(open_storage(args.bucket))
    if manifest is None:
        print(f"{args.bucket}: no version yet")
        return 0
    for v in manifest.versions:
        base = "-" if v.base_version is None else v.base_version
        print(f"{v.version} {v.kind} base={base} files={len(v.files)} bytes={v.delta_bytes + v.anchor_bytes} "
              f"delta_bytes={v.delta_bytes} anchor_bytes={v.anchor_bytes} state={v.state_hash} "
              f"sha256={','.join(f.sha256[:12] for f in v.files)}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .bucket.manifest import read_manifest
    from .bucket.retention import gc
    from .storage import open_storage

    storage = open_storage(args.bucket)
    manifest = read_manifest(storage)
    if manifest is None:
        print(f"{args.bucket}: no version yet, nothing to collect")
        return 0
    report = gc(storage, manifest, args.keep_anchors)
    print(f"dropped versions {list(report.dropped_versions)}, deleted {len(report.deleted)} files; "
          f"versions {report.manifest.versions[0].version}..{report.manifest.latest.version} remain")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("diff", help="write the delta from OLD to NEW (safetensors files or model folders)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--codec", default=DEFAULT_CODEC, choices=sorted(CODECS),
                   help=f"default {DEFAULT_CODEC}; " + "; ".join(f"{c.name}: {c.description}" for c in CODECS.values()))
    p.add_argument("--version", type=int, default=None, help="model version the delta produces")
    p.add_argument("--base-version", type=int, default=None, help="model version it applies to")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("apply", help="apply DELTA to BASE and write the result as one safetensors file")
    p.add_argument("base")
    p.add_argument("delta")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("inspect", help="print a delta's header and per-tensor table")
    p.add_argument("file")
    p.add_argument("--limit", type=int, default=50, help="tensors listed (largest first; 0 for all)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="check what a delta alone can show (and say what that was); with --base, "
                                      "that it applies exactly")
    p.add_argument("file")
    p.add_argument("--base", default=None, help="state the delta should apply to")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("publish", help="publish STATE (safetensors file or model folder) as the bucket's next version")
    p.add_argument("state")
    p.add_argument("--bucket", required=True, help="local folder, s3://bucket[/prefix] or hf://buckets/ns/name")
    p.add_argument("--anchor-every", type=int, default=50, help="an anchor every N versions (default 50)")
    p.add_argument("--keep-anchors", type=int, default=2, help="anchors kept by retention (default 2)")
    p.add_argument("--anchor", action="store_true", help="publish a full snapshot with this version")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("pull", help="write a bucket's version as one safetensors file, verified against its hash")
    p.add_argument("--bucket", required=True)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--version", type=int, default=None, help="default: the newest")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("log", help="list a bucket's versions, one line each")
    p.add_argument("--bucket", required=True)
    p.set_defaults(func=cmd_log)

    from .follow import add_command as add_follow  # its own module: a sidecar beside `vllm serve`

    add_follow(sub)

    p = sub.add_parser("gc", help="drop versions before the newest K anchors and delete unreferenced files")
    p.add_argument("--bucket", required=True)
    p.add_argument("--keep-anchors", type=int, required=True)
    p.set_defaults(func=cmd_gc)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DeltaError, OSError, ValueError) as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)  # one line, whatever the file put in it
        return 1
