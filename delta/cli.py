"""`python -m delta`: diff, apply, inspect and verify delta files; publish, pull, log and gc a bucket.

Every command writes its output atomically (nothing is written on failure) and exits non-zero with
a one-line message on bad input: 1 for a file or bucket that cannot be used, 2 for a usage error (such as
a bucket folder that does not exist: mistyped, it would otherwise read as an empty bucket; `publish
--create` makes a new one). Bucket commands take a URL (`delta.Bucket.open`); S3 endpoints and credentials come
from the usual AWS environment variables. Everything printed from a file is escaped (`printable`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .atomic import write_atomic
from .bucket.handle import Bucket
from .codecs import CODECS, DEFAULT_CODEC
from .errors import DeltaError, printable
from .format import read_delta
from .inspect import check_delta, inspect_delta
from .patch.apply import apply, decode
from .patch.diff import diff
from .signing import HANDOVER_VARIABLE, PublicKey, previous_key
from .tensors.state import load_state, save_state


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class UsageError(Exception):
    """A command line that cannot work as given (exit status 2, as argparse's own usage errors)."""


def local_folder(url: str) -> str | None:
    """The folder of a local bucket URL (a plain path or file://), None for a remote one."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return rest if scheme == "file" else None


def check_bucket(url: str, create: bool = False, hint: str = "check the path") -> None:
    """Refuse a local bucket folder that does not exist, unless `create`: a mistyped path would otherwise be
    created and read as a bucket with no version yet. Remote buckets are not checked (it would cost a call).

    Raises:
        UsageError: the folder does not exist and `create` is False; the message ends with `hint`.
    """
    folder = local_folder(url)
    if folder is not None and not create and not os.path.exists(os.path.expanduser(folder)):
        raise UsageError(f"the bucket folder {folder!r} does not exist; {hint}")


def human_bytes(n: int) -> str:
    """`n` bytes for people: 812 B, 40.1 kB, 1.2 MB, 3.4 GB (powers of 1000)."""
    size: float = n
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def cmd_diff(args: argparse.Namespace) -> int:
    old, new = load_state(args.old), load_state(args.new)
    start = time.perf_counter()
    data = diff(old, new, codec=args.codec, version=args.version, base_version=args.base_version, progress=True)
    write_atomic(args.output, data)
    header, _ = read_delta(data)  # the header alone: no need to decode the streams again
    print(
        f"wrote {args.output}: {len(data):,} bytes, {header.changed:,} of {header.total:,} elements "
        f"changed ({100 * header.density:.3f}%), {len(data) / max(header.changed, 1):.3f} B/changed, codec "
        f"{args.codec}, {time.perf_counter() - start:.2f} s"
    )
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    state = load_state(args.base)
    result = apply(state, args.delta)
    save_state(state, args.output)
    h = result.header
    checked = (
        "hash"
        if not h.foreign
        else "TRL checksum_sha256 matched, hash"
        if h.checksum
        else "TRL file without hashes, hash"
    )
    print(
        printable(
            f"wrote {args.output}: version {h.version}, {result.changed:,} elements changed, "
            f"{checked} {result.digest.hexdigest}"
        )
    )
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
        print(
            printable(
                f"OK {args.file}: applies to {args.base} and gives {header.target_hash} (base hash, every "
                "stream and value, and the target hash checked)"
            )
        )
    else:
        what = "its checksum_sha256 matched" if header.checksum else "the file carries no hashes"
        print(
            printable(
                f"OK {args.file}: applies to {args.base} (TRL file: names, dtypes, shapes and positions "
                f"checked; {what})"
            )
        )
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from .bucket.publish import Publisher, PublisherConfig

    state = load_state(args.state)
    config = PublisherConfig(anchor_every=args.anchor_every, keep_anchors=args.keep_anchors)
    previous = previous_key(args.handover_from_file)  # the file, else DELTA_HANDOVER_FROM; never a plain argument
    with Publisher(args.bucket, config, handover_from=previous) as publisher:
        publisher.publish(state, anchor=args.anchor)
        publisher.flush()
    last, key = publisher.last, publisher.public_key
    assert last is not None and key is not None  # one process: rank 0, which published and signed
    handed = (
        f", handed over from {previous.public.fingerprint}" if previous is not None and previous.public != key else ""
    )
    print(
        f"published version {last.version} ({last.kind}) to {args.bucket}: {last.bytes_written:,} bytes, "
        f"state {last.state_hash}, signed by {key.fingerprint}{handed} (readers: --trusted-key {key.text})"
    )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .bucket.subscribe import Subscriber

    bucket = Bucket.open(args.bucket, trusted_key=args.trusted_key, unauthenticated=args.unauthenticated)
    with Subscriber(bucket) as subscriber:
        version = subscriber.sync(args.version)
    if version is None:
        print(f"error: {args.bucket} holds no version yet", file=sys.stderr)
        return 1
    assert subscriber.state is not None and subscriber.digest is not None  # at `version`
    save_state(
        subscriber.state, args.output, metadata={"version": str(version), "state_hash": subscriber.digest.hexdigest}
    )
    print(
        printable(
            f"wrote {args.output}: version {version}, state {subscriber.digest.hexdigest} (verified; "
            f"{subscriber.trust.describe()})"
        )
    )
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from .bucket.manifest import newest_manifest

    manifest = newest_manifest(Bucket.open(args.bucket), on_refused=_warn_refused)
    if manifest is None:
        print(f"{printable(args.bucket)}: no version yet")
        return 0
    versions = manifest.versions
    print(
        printable(
            f"{args.bucket}: versions {versions[0].version}..{versions[-1].version} "
            f"({len(manifest.anchors())} with an anchor), {manifest.path}"
        )
    )
    print(
        f"{'version':>8}  {'kind':<6}  {'base':>6}  {'files':>5}  {'delta':>9}  {'anchor':>9}  "
        f"{'published (UTC)':<19}  {'signed by (not checked here)':<28}  "
        "state hash, sha256 of each file (first 12 hex digits)"
    )
    for v in versions:
        base = "-" if v.base_version is None else v.base_version
        when = "-" if v.published_at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(v.published_at))
        signer = PublicKey.parse(v.signer).fingerprint[:28] if v.signer else "unsigned"
        print(
            printable(
                f"{v.version:>8}  {v.kind:<6}  {base:>6}  {len(v.files):>5}  "
                f"{human_bytes(v.delta_bytes) if v.delta else '-':>9}  "
                f"{human_bytes(v.anchor_bytes) if v.anchor else '-':>9}  {when:<19}  {signer:<28}  "
                f"{v.state_hash}  {','.join(f.sha256[:12] for f in v.files)}"
            )
        )
    return 0


def _warn_refused(error: DeltaError) -> None:
    print(f"warning: skipping a manifest: {printable(str(error))}", file=sys.stderr)


def cmd_gc(args: argparse.Namespace) -> int:
    from .bucket.manifest import newest_manifest
    from .bucket.retention import gc

    bucket = Bucket.open(args.bucket)
    manifest = newest_manifest(bucket, on_refused=_warn_refused)
    if manifest is None:
        print(f"{printable(args.bucket)}: no version yet, nothing to collect")
        return 0
    report = gc(bucket, manifest, args.keep_anchors)
    assert report.manifest.latest is not None  # gc keeps the latest version
    print(
        f"dropped versions {list(report.dropped_versions)}, deleted {len(report.deleted)} files; "
        f"versions {report.manifest.versions[0].version}..{report.manifest.latest.version} remain"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .follow import add_command as add_follow  # its own module: a sidecar beside `vllm serve`
    from .follow import add_trust_arguments

    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("diff", help="write the delta from OLD to NEW (safetensors files or model folders)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("-o", "--output", required=True)
    p.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        choices=sorted(CODECS),
        help=f"default {DEFAULT_CODEC}; " + "; ".join(f"{c.name}: {c.description}" for c in CODECS.values()),
    )
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

    p = sub.add_parser(
        "verify", help="check what a delta alone can show (and say what that was); with --base, that it applies exactly"
    )
    p.add_argument("file")
    p.add_argument("--base", default=None, help="state the delta should apply to")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("publish", help="publish STATE (safetensors file or model folder) as the bucket's next version")
    p.add_argument("state")
    p.add_argument("--bucket", required=True, help="local folder, s3://bucket[/prefix] or hf://buckets/ns/name")
    p.add_argument("--anchor-every", type=int, default=50, help="an anchor every N versions (default 50)")
    p.add_argument("--keep-anchors", type=int, default=2, help="anchors kept by retention (default 2)")
    p.add_argument("--anchor", action="store_true", help="publish a full snapshot with this version")
    p.add_argument(
        "--create",
        action="store_true",
        help="start a new bucket if the folder does not exist (without it, a missing folder is an error)",
    )
    p.add_argument(
        "--handover-from-file",
        default=None,
        metavar="FILE",
        help="the signing key this one replaces (a file of yours holding its ed25519-private:... text, or a key file "
        "kept in ~/.cache/delta/keys): its versions are signed again with the new key and a handover signed with it "
        f"lets readers that trust it follow the new key (env {HANDOVER_VARIABLE}: the key's text)",
    )
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser(
        "pull",
        help="write a bucket's version as one safetensors file, verified against its hash and the trainer's signature",
    )
    p.add_argument("--bucket", required=True)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--version", type=int, default=None, help="default: the newest")
    add_trust_arguments(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("log", help="list a bucket's versions, one line each under a header (sizes in kB/MB/GB)")
    p.add_argument("--bucket", required=True)
    p.set_defaults(func=cmd_log)

    add_follow(sub)

    p = sub.add_parser("gc", help="drop versions before the newest K anchors and delete unreferenced files")
    p.add_argument("--bucket", required=True)
    p.add_argument("--keep-anchors", type=int, required=True)
    p.set_defaults(func=cmd_gc)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "bucket", None) is not None:  # every bucket command: a mistyped folder is not a new bucket
            check_bucket(
                args.bucket,
                getattr(args, "create", False),
                "pass --create to start a new bucket there" if args.command == "publish" else "check the path",
            )
        return args.func(args)
    except UsageError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 2
    except (DeltaError, OSError, ValueError) as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)  # one line, whatever the file put in it
        return 1
