"""Fuzzing the reader with mutated real deltas of every codec and every TRL layout.

Each example takes a real file and mutates it as someone with write access to a bucket could: header
fields replaced by other JSON types, non-canonical numbers, huge or negative counts, deleted and added
keys; table entries duplicated (with streams that decode, and hashes recomputed as a forger would),
reordered, or nested thousands deep; stream bytes flipped, cut, extended, or replaced by zstd frames.
For every file, through `delta.apply`, `inspect`, and the command line run in this process:

- either it is refused: a `DeltaError` (on the command line: exit 1 and one printable line), the
  state untouched, no output written;
- or it applies, and the state then hashes to the header's target hash (a TRL file with a
  `checksum_sha256`: to that checksum).

Anything else fails the test (another exception type is a traceback for the user). The same mutated
deltas are served to a `Subscriber` from a bucket whose manifest the forger rewrote to match: a bad
version never advances the reader.

Seeded and bounded for CI; a longer run is one variable away:

    DELTA_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py     # default 40 per layout
    DELTA_FUZZ_SEED=7 ...                                            # another sequence (default 0)
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import os
import shutil
import tempfile
import zlib
from collections import Counter
from dataclasses import replace

import pytest
import torch
import zstandard
from hypothesis import HealthCheck, event, given, note, seed, settings
from hypothesis import strategies as st

from delta import Bucket
from delta import Publisher, PublisherConfig, Subscriber
import delta
from delta import read_manifest
from delta.bucket.manifest import file_ref, manifest_commits, manifest_path, write_manifest
from delta.cli import main
from delta.format import read_header_json
from delta.inspect import inspect_delta

from . import _trl_writers as trl
from wire.fleet import decode

from ._forgery import Parts, Raw, deep, dumps, forge_duplicate, forge_reorder, join, split
from ._signed import signed
from ._states import clone, states_equal

EXAMPLES = int(os.environ.get("DELTA_FUZZ_EXAMPLES", "40"))
SEED = int(os.environ.get("DELTA_FUZZ_SEED", "0"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


# -- the real files mutated -----------------------------------------------------------------------------------


def own_states() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(11)
    old = {"a.w": (torch.randn(64, 96, generator=g) * 0.02).bfloat16(),
           "b.w": (torch.randn(5000, generator=g) * 0.02).bfloat16(),
           "c.f32": torch.randn(300, generator=g),
           "d.norm": torch.ones(32, dtype=torch.bfloat16)}
    new = {k: (v.float() - 1e-4 * torch.sign(torch.randn(v.shape, generator=g))).to(v.dtype) for k, v in old.items()}
    new["c.f32"] = old["c.f32"].clone()
    new["c.f32"][::9] += 1e-5
    return old, new


def trl_pair() -> tuple[dict, dict]:
    old, new, _ = trl.trl_states(seed=3, steps=2)
    return old, new


OWN = own_states()
TRL = trl_pair()
LAYOUTS = ["ctx", "gap", "raw", "trl-earlier", "trl-earlier-anchor", "trl-middle", "trl-later-gap",
           "trl-later-raw", "trl-later-anchor"]


def pair_of(layout: str) -> tuple[dict, dict]:
    return OWN if layout in delta.CODECS else TRL


@functools.cache
def real_file(layout: str) -> bytes:
    old, new = pair_of(layout)
    if layout in delta.CODECS:
        return delta.diff(old, new, codec=layout, version=2, base_version=1)
    return {"trl-earlier": lambda: trl.earlier_patch(old, new, 2, anchor_step=1),
            "trl-earlier-anchor": lambda: trl.earlier_anchor(new, 2),
            "trl-middle": lambda: trl.middle_patch(old, new, 2),
            "trl-later-gap": lambda: trl.later_patch(old, new, 2, "gap_delta"),
            "trl-later-raw": lambda: trl.later_patch(old, new, 2, "raw"),
            "trl-later-anchor": lambda: trl.later_patch(None, new, 2)}[layout]()


# -- a safetensors file as parts, and back (any JSON, even what safetensors itself would refuse) ---------------


# -- what a forger puts where ----------------------------------------------------------------------------------


TRICKY_STRINGS = ["40.9", "١٣٠", " 13_288 ", "８", "-1", "-0", "0", "007", "1e3", "+5", "", "1" + "0" * 40,
                  "9" * 5000, "\x1b[2J\x07", "True", "False", "raw", "gap_delta", "nvcomp_cascaded", "sparse",
                  "indices", "sum128:" + "0" * 32, "sum128:\x1b[31m" + "0" * 29, "[]", '["a.w"]',
                  '["nope"]', "NaN", deep(3), deep(2000), "sparse_weight_patch", "anchor_checkpoint", "delta-weights",
                  "2", "1", "a" * 64, "0" * 64, "\ud800", "a.w\ud800", "\u202e"]


def deep_object(k: int) -> str:
    return '{"a":' * k + "1" + "}" * k


RAW_VALUES = [Raw(deep(k)) for k in (4, 50, 999, 5000)] + [Raw(deep_object(k)) for k in (4, 3000)] + [
    Raw("NaN"), Raw("Infinity"), Raw("1E5"), Raw("-0"), Raw("1.0"), Raw("12345678901234567890123")]
JSON_VALUES = st.one_of(
    st.integers(-(2**70), 2**70), st.just(10**400), st.sampled_from([40.9, -1.5, 1e300]),
    st.sampled_from(TRICKY_STRINGS), st.text(max_size=12), st.none(), st.booleans(),
    st.lists(st.integers(-3, 2**40), max_size=4), st.just({"name": "a.w"}), st.sampled_from(RAW_VALUES))


def numeric_neighbours(value: str) -> list[str]:
    try:
        n = int(value)
    except ValueError:
        return []
    return [str(n + d) for d in (-1, 1, 10**6)] + [str(-n), f" {n}", f"{n}.0", f"+{n}"]


@st.composite
def meta_value(draw, old: object):
    choices = TRICKY_STRINGS + (numeric_neighbours(old) if isinstance(old, str) else [])
    as_json = JSON_VALUES.map(lambda v: v if isinstance(v, Raw) else Raw(json.dumps(v)))  # not a string at all
    return draw(st.one_of(st.sampled_from(choices), st.text(max_size=16), as_json))


def table_of(p: Parts) -> tuple[str, list] | None:
    """(key, parsed list) of the metadata's JSON table: `tensors` (ours) or `changed_params` (TRL)."""
    for key in ("tensors", "changed_params"):
        if p.meta and isinstance(p.meta.get(key), str):
            try:
                table = json.loads(p.meta[key])
            except (ValueError, RecursionError):
                return None
            if isinstance(table, list) and table and _shallow(table):
                return key, table
    return None


def _shallow(value, limit: int = 20) -> bool:
    """True when `value` is nested at most `limit` deep (the mutations recurse over it)."""
    level = [value]
    for _ in range(limit):
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())]
        if not level:
            return True
    return False


class Mutated(bytes):
    """A mutated file; its repr stays short in hypothesis' reports (the notes show its header)."""

    def __repr__(self) -> str:
        return f"<{len(self)}-byte file>"


@st.composite
def mutate(draw, layout: str) -> bytes:
    """One to three mutations of the layout's real file, or a forger's consistent file (duplicated or reordered
    entries), possibly mutated further."""
    data = real_file(layout)
    if layout in delta.CODECS and draw(st.integers(0, 9)) == 0:
        if draw(st.booleans()):
            name = draw(st.sampled_from(sorted(n for n in OWN[0] if not torch.equal(OWN[0][n], OWN[1][n]))))
            event("forged: duplicated entry")
            data = forge_duplicate(*OWN, name, layout, draw(st.integers(0, 2**16)))
        else:
            event("forged: reordered entries")
            data = forge_reorder(*OWN, layout)
        if draw(st.booleans()):
            return Mutated(data)
    p = split(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["meta_set", "meta_del", "table_field", "table_dup", "table_swap",
                                     "table_raw", "blob_bytes", "blob_entry", "blob_add", "blob_del", "nest",
                                     "tail", "length"]))
        event(f"mutation: {kind}")
        table = table_of(p)
        if kind == "meta_set" and p.meta is not None:
            key = draw(st.sampled_from(sorted(p.meta) + ["sparse", "changed_params", "encoding", "checksum_sha256",
                                                         "format", "version", "extra"]))
            p.meta[key] = draw(meta_value(p.meta.get(key)))
        elif kind == "meta_del" and p.meta:
            del p.meta[draw(st.sampled_from(sorted(p.meta)))]
        elif kind == "table_field" and table:
            key, rows = table
            i = draw(st.integers(0, len(rows) - 1))
            if isinstance(rows[i], dict):
                f = draw(st.sampled_from(["name", "dtype", "shape", "form", "changed", "extra"]))
                if draw(st.integers(0, 5)) == 0:
                    rows[i].pop(f, None)
                else:
                    rows[i][f] = draw(JSON_VALUES)
            else:
                rows[i] = draw(JSON_VALUES)
            p.meta[key] = dumps(rows)
        elif kind == "table_dup" and table:
            key, rows = table
            i = draw(st.integers(0, len(rows) - 1))
            row = dict(rows[i]) if isinstance(rows[i], dict) else rows[i]
            if isinstance(row, dict) and draw(st.booleans()):
                row["changed"] = draw(st.integers(0, 10**6))
            rows.insert(draw(st.integers(0, len(rows))), row)
            p.meta[key] = dumps(rows)
        elif kind == "table_swap" and table and len(table[1]) > 1:
            key, rows = table
            i, j = draw(st.lists(st.integers(0, len(rows) - 1), min_size=2, max_size=2, unique=True))
            rows[i], rows[j] = rows[j], rows[i]
            p.meta[key] = dumps(rows)
        elif kind == "table_raw" and p.meta is not None:
            key = table[0] if table else draw(st.sampled_from(["tensors", "changed_params"]))
            p.meta[key] = draw(st.sampled_from([deep(k) for k in (3, 4, 999, 5000, 100_000)]
                                               + [deep(3000, "{\"a\":", "}"), "[", "{}", "[1,2,3]", '[{"name": 1}]',
                                                  '[{"name":"a.w","dtype":"bfloat16","shape":[64,96],"form":"sparse",'
                                                  '"changed":1}]', "[\"a.w\",\"a.w\"]"]))
        elif kind == "blob_bytes" and p.blobs:
            name = draw(st.sampled_from(sorted(p.blobs)))
            p.blobs[name][2] = draw(blob_bytes(p.blobs[name][2]))
        elif kind == "blob_entry" and p.blobs:
            name = draw(st.sampled_from(sorted(p.blobs)))
            if draw(st.booleans()):
                p.blobs[name][0] = draw(st.sampled_from(["U8", "I32", "I64", "U16", "U32", "BF16", "F32", "BOOL"]))
            else:
                p.blobs[name][1] = draw(st.sampled_from([[], [0], [1, len(p.blobs[name][2])], [2**40],
                                                         [len(p.blobs[name][2]) // 2]]))
        elif kind == "blob_add":
            names = sorted(p.blobs)
            base = draw(st.sampled_from(names)).rsplit(".", 1)[0] if names else "a.w"
            new = draw(st.sampled_from(["extra", "models2", f"{base}.indices", f"{base}.values", f"{base}.idx",
                                        f"{base}.val", "__empty_delta__", "zz.w.indices", "zz.w"]))
            p.blobs[new] = ["U8", [4], b"\x00\x01\x02\x03"] if new not in p.blobs else p.blobs[new]
        elif kind == "blob_del" and p.blobs:
            del p.blobs[draw(st.sampled_from(sorted(p.blobs)))]
        elif kind == "nest":
            where = draw(st.sampled_from(["extra", "meta"]))
            value = Raw(draw(st.sampled_from([deep(k) for k in (4, 999, 20_000)] + ["[" + "1," * 50_000 + "1]"])))
            if where == "meta" and p.meta is not None:
                p.meta[draw(st.sampled_from(sorted(p.meta) or ["x"]))] = value
            else:
                p.extra["zzz"] = value
        elif kind == "tail":
            p.tail = draw(st.binary(min_size=1, max_size=64))
        elif kind == "length":
            p.length_delta = draw(st.sampled_from([-8, -1, 1, 8, 2**20, 2**40]))
    return Mutated(join(p))


@st.composite
def blob_bytes(draw, raw: bytes) -> bytes:
    op = draw(st.sampled_from(["flip", "cut", "extend", "random", "zstd", "zstd_tail", "zstd_zero"]))
    if op == "flip" and raw:
        out = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(out) - 1))
            out[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if op == "cut" and raw:
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if op == "extend":
        return raw + draw(st.binary(min_size=1, max_size=32))
    if op == "random":
        return draw(st.binary(max_size=256))
    if op in ("zstd", "zstd_tail"):
        payload = draw(st.binary(max_size=512)) if draw(st.booleans()) else bytes(draw(st.integers(0, 1 << 20)))
        frame = zstandard.ZstdCompressor().compress(payload)
        return frame + (draw(st.binary(min_size=1, max_size=16)) if op == "zstd_tail" else b"")
    if op == "zstd_zero" and raw:  # the real stream with bytes after its frame
        return raw + zstandard.ZstdCompressor().compress(b"\0" * 8)
    return raw + zlib.compress(b"x")


# -- the checks -------------------------------------------------------------------------------------------------


def claimed(data: bytes) -> tuple[str | None, str | None]:
    """(target_hash, checksum_sha256) as the file's metadata writes them, when they are strings."""
    try:
        meta = read_header_json(data).get("__metadata__") or {}
    except delta.DeltaError:
        return None, None
    target, checksum = meta.get("target_hash"), meta.get("checksum_sha256")
    return (target if isinstance(target, str) else None), (checksum if isinstance(checksum, str) else None)


def check_library(data: bytes, base: dict, layout: str) -> str:
    state = clone(base)
    target, checksum = claimed(data)
    try:
        result = delta.apply(state, data, workers=2)
    except delta.DeltaError as e:
        assert "\n" not in str(e), str(e)
        assert states_equal(state, base), "a refused delta changed the state"
        return type(e).__name__
    if not result.header.foreign:
        assert result.header.target_hash == target
        assert delta.state_digest(state).hexdigest == target, "applied, but the state is not the header's target"
    elif checksum:
        assert trl.bf16_checksum(state) == checksum, "applied, but the state does not match checksum_sha256"
    return "applied"


def check_inspect(data: bytes) -> None:
    try:
        text = inspect_delta(data).render(limit=0)
    except delta.DeltaError as e:
        assert "\n" not in str(e)
        return
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def check_cli(data: bytes, base_path: str, layout: str, folder: str) -> None:
    path, output = os.path.join(folder, "x.delta"), os.path.join(folder, "out.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    target, checksum = claimed(data)
    for args in (["apply", base_path, path, "-o", output], ["inspect", path, "--limit", "0"], ["verify", path],
                 ["verify", path, "--base", base_path]):
        rc, out, err = run_cli(*args)
        assert rc in (0, 1), (args, rc)
        for text in (out, err):
            assert all(c.isprintable() or c == "\n" for c in text), repr(text)
        if rc:
            assert err.startswith("error: ") and err.count("\n") == 1, err
            if args[0] == "apply":
                assert not os.path.exists(output)
        elif args[0] == "apply":
            got = delta.load_state(output)
            if layout in delta.CODECS:
                assert delta.state_digest(got).hexdigest == target
            elif checksum:
                assert trl.bf16_checksum(got) == checksum
            os.remove(output)


@pytest.fixture(scope="module")
def base_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    paths = {}
    for name, (old, _) in (("own", OWN), ("trl", TRL)):
        paths[name] = str(folder / f"{name}.safetensors")
        delta.save_state(old, paths[name])
    return paths


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_mutated_file_is_refused_in_one_line_or_reaches_its_target(layout, base_files):
    good = real_file(layout)
    old, new = pair_of(layout)
    base_path = base_files["own" if layout in delta.CODECS else "trl"]
    state = clone(old)
    delta.apply(state, good)  # the file as written applies exactly
    assert states_equal(state, new)

    outcomes: Counter[str] = Counter()

    @seed(SEED)
    @FUZZ
    @given(st.data())
    def fuzz(data):
        mutated = data.draw(mutate(layout))
        note(f"{len(mutated)} bytes, header {mutated[8:8 + 600]!r}")
        outcomes[check_library(mutated, old, layout)] += 1
        check_inspect(mutated)
        with tempfile.TemporaryDirectory() as folder:
            check_cli(mutated, base_path, layout, folder)

    fuzz()
    print(f"{layout}: {dict(outcomes)}")  # shown with -s
    assert outcomes["DeltaFormatError"] > 0


# -- through a Subscriber ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A bucket with version 1 (anchor) and version 2 (a ctx delta, no anchor)."""
    folder = tmp_path_factory.mktemp("bucket")
    old, new = OWN
    with Publisher(str(folder), PublisherConfig(anchor_every=1000)) as pub:
        for s in (old, new):
            pub.publish(s)
            assert pub.flush(timeout=60)
    return folder


def test_a_mutated_version_never_advances_a_subscriber(bucket):
    old, new = OWN
    manifest = read_manifest(Bucket.open(str(bucket)))
    entry = manifest.get(2)
    assert entry.kind == "delta" and not entry.anchor
    assert (bucket / entry.delta[0].path).read_bytes() == real_file("ctx")  # the publisher's file is the one mutated

    outcomes: Counter[str] = Counter()

    @seed(SEED)
    @settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
    @given(st.data())
    def fuzz(data):
        mutated = data.draw(mutate("ctx"))
        target, _ = claimed(mutated)
        with tempfile.TemporaryDirectory() as folder:
            shutil.copytree(bucket, folder, dirs_exist_ok=True)
            storage = Bucket.open(folder)
            storage.write(entry.delta[0].path, mutated)  # the forger rewrites the file and the manifest to match
            forged = replace(entry, delta=(file_ref(entry.delta[0].path, mutated),),
                             state_hash=target if target else entry.state_hash)
            m = read_manifest(storage)
            write_manifest(storage, signed(storage, replace(m, commit=m.commit + 1, versions=(m.versions[0], forged))))
            reader = Subscriber(folder, clone(old), version=1)
            try:
                reader.sync()
            except delta.DeltaError as e:
                assert "\n" not in str(e)
            finally:
                reader.close()
            if reader.version == 2:
                outcomes["applied"] += 1
                assert delta.state_digest(reader.state).hexdigest == forged.state_hash == target
            else:
                outcomes["stayed at 1"] += 1
                assert reader.version == 1 and states_equal(reader.state, old)

    fuzz()
    print(f"subscriber: {dict(outcomes)}")  # shown with -s
    assert outcomes["stayed at 1"] > 0


# -- manifests, multi-rank and pieced versions (issue 37) -----------------------------------------------------------
#
# Real buckets written by two gloo ranks (`tests._ranked`: tensors split by name, and every tensor cut into pieces),
# whose newest manifest a forger rewrites: fields replaced by any JSON (numbers in every form, strings where numbers
# belong, control characters), entries deleted, duplicated, moved between ranks and versions, pieces re-cut; the
# cases of issue 37 (`tests.test_whole.FORGED`) are seeds. For each, a new reader and one at version 1 sync, and
# `delta log` and `delta pull` run: a reader either holds exactly the published state of the version it reports
# (and its digest is its state's), or refuses in one line (`DeltaError`) keeping what it held; nothing printed
# holds a control character.


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    from ._ranked import ranked_bucket

    return {mode: ranked_bucket(tmp_path_factory.mktemp(mode) / "bucket", mode) for mode in ("names", "split")}


def _positions(value, limit: int = 400) -> list[tuple[object, object]]:
    """(container, key) of every value in a JSON tree, breadth first, at most `limit`."""
    out, level = [], [value]
    while level and len(out) < limit:
        nxt = []
        for node in level:
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, child in items:
                out.append((node, key))
                nxt.append(child)
        level = nxt
    return out[:limit]


def _neighbours(value) -> list:
    if isinstance(value, bool) or not isinstance(value, int):
        return [value]
    return [value + 1, value - 1, -value, str(value), float(value), True, Raw("1e400"), Raw(f"{value}.0"),
            "".join(chr(0x660 + int(d)) for d in str(abs(value))), [value], None]


TREE_EDITS = ("set", "neighbour", "delete", "duplicate")


def edit_tree(draw, body, kind: str) -> None:
    """One forger's edit anywhere in a JSON tree: a value replaced by any JSON or a neighbour of it, a key or
    element deleted, an element of an array duplicated."""
    spots = _positions(body)
    if not spots:
        return
    node, key = spots[draw(st.integers(0, len(spots) - 1))]
    if kind == "set":
        node[key] = draw(JSON_VALUES)
    elif kind == "neighbour":
        node[key] = draw(st.sampled_from(_neighbours(node[key])))
    elif kind == "delete":
        del node[key]
    elif isinstance(node[key], list) and node[key]:
        node[key].insert(draw(st.integers(0, len(node[key]))), draw(st.sampled_from(node[key])))


@st.composite
def mutate_manifest(draw, body: dict) -> str:
    """JSON text of `body` (a manifest) after one to three forger's edits; values may be `Raw` text."""
    from .test_whole import FORGED

    body = json.loads(json.dumps(body))
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(FORGED)))
        event(f"manifest seed: {name}")
        try:
            FORGED[name][1](body)
        except (IndexError, KeyError, TypeError):  # a seed for the other layout
            pass
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "neighbour", "delete", "duplicate", "move_name", "rank", "swap",
                                     "slice", "raw"]))
        event(f"manifest mutation: {kind}")
        if kind in TREE_EDITS:
            edit_tree(draw, body, kind)
        elif kind == "move_name" and body.get("shards"):
            ranks = body["shards"]
            src = draw(st.integers(0, len(ranks) - 1))
            if ranks[src]:
                name = ranks[src].pop(draw(st.integers(0, len(ranks[src]) - 1))) if draw(st.booleans()) \
                    else draw(st.sampled_from(ranks[src]))
                ranks[draw(st.integers(0, len(ranks) - 1))].append(name)
        elif kind == "rank":
            files = [f for v in body.get("versions", []) for f in v.get("delta", []) + v.get("anchor", [])]
            if files:
                draw(st.sampled_from(files))["rank"] = draw(st.sampled_from([0, 1, 2, 3, -1, 2**63, "1", True]))
        elif kind == "swap":
            versions = body.get("versions", [])
            if len(versions) > 1:
                i, j = draw(st.lists(st.integers(0, len(versions) - 1), min_size=2, max_size=2, unique=True))
                field = draw(st.sampled_from(["delta", "anchor", "state_hash", "base_hash", "version"]))
                versions[i][field], versions[j][field] = versions[j].get(field), versions[i].get(field)
        elif kind == "slice" and body.get("pieces"):
            cut = body["pieces"][draw(st.sampled_from(sorted(body["pieces"])))]
            piece = draw(st.sampled_from(cut["slices"])) if cut["slices"] else None
            if piece is not None:
                piece[draw(st.integers(0, 2))] = draw(st.sampled_from([0, 1, 249, 250, 251, 500, 10**9, "250",
                                                                        "layers.1.w", "head.fp32@0:0"]))
        elif kind == "raw":
            text = json.dumps(body)
            return draw(st.sampled_from([text[:len(text) // 2], text.replace("1", "\u0661", 1), text + "x",
                                         text.replace('"commit": ', '"commit": 1e400, "c": ', 1), deep(5000)]))
    return dumps(body)


class _Printed(logging.Handler):
    """Keeps every log record's message: what the command line would print as a warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _printable(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def check_reader(bucket: str, start: int | None) -> str:
    from ._ranked import STATES

    state = clone(STATES[1]) if start else None
    with Subscriber(bucket, state, version=start) as reader:
        try:
            reader.sync()
            outcome = f"at {reader.version}"
        except delta.DeltaError as e:
            assert "\n" not in str(e), str(e)
            outcome = type(e).__name__
        if reader.version is None:
            assert reader.state is None
            return outcome
        assert states_equal(reader.state, STATES[reader.version]), f"version {reader.version} is not what was published"
        assert reader.digest.hexdigest == delta.state_digest(reader.state).hexdigest  # the same hash whole or in pieces
        return outcome


def check_bucket_cli(bucket: str, folder: str) -> None:
    from ._ranked import STATES

    output = os.path.join(folder, "pulled.safetensors")
    for args in (["log", "--bucket", bucket], ["pull", "--bucket", bucket, "-o", output]):
        rc, out, err = run_cli(*args)
        assert rc in (0, 1), (args, rc)
        assert _printable(out) and _printable(err), repr(out + err)
        if rc:
            assert err.splitlines()[-1].startswith("error: "), err
            assert not os.path.exists(output)
        elif args[0] == "pull":
            version = int(out.split("version ")[1].split(",")[0])
            assert states_equal(delta.load_state(output), STATES[version])
            os.remove(output)


@pytest.mark.parametrize("mode", ["names", "split"])
def test_a_forged_manifest_leaves_every_reader_on_a_state_it_reports_or_refused(ranked, mode, tmp_path):
    from ._ranked import manifest_body

    source = ranked[mode]
    body = manifest_body(source)
    body["commit"] += 1  # written as the next commit, where the real newest was
    outcomes: Counter[str] = Counter()
    printed = _Printed()
    logging.getLogger("delta").addHandler(printed)

    @seed(SEED)
    @settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
    @given(st.data())
    def fuzz(data):
        text = data.draw(mutate_manifest(body))
        note(text[:2000])
        with tempfile.TemporaryDirectory() as folder:
            bucket = os.path.join(folder, "bucket")
            shutil.copytree(source, bucket)
            storage = Bucket.open(bucket)
            storage.delete([path for _, path in manifest_commits(storage)[:1]])  # the real newest leaves: good are 1-2
            storage.write(manifest_path(body["commit"]), text.encode())
            for start in (None, 1):
                outcomes[check_reader(bucket, start)] += 1
            check_bucket_cli(bucket, folder)
        assert all(_printable(m) for m in printed.messages), [m for m in printed.messages if not _printable(m)][:1]
        printed.messages.clear()

    try:
        fuzz()
    finally:
        logging.getLogger("delta").removeHandler(printed)
    print(f"manifests ({mode}): {dict(outcomes)}")  # shown with -s
    assert outcomes["at 2"] > 0 and outcomes["at 3"] > 0


# -- fleet files (issue 37) -------------------------------------------------------------------------------------------
#
# A valid group of a run, its JSON mutated as a forger would (any JSON where numbers belong, "NaN" strings, ids beyond
# the vocabulary, huge versions, games added and removed), then resealed (hash recomputed, and signed with the run's
# key half of the time, as a buggy server holding the token would): `decode` and `check_group` refuse it with a
# `FleetMessageError`, or the group holds only what a step can train on; the trainer's rollout function takes the
# good group beside it and never raises.


def _fleet_run():
    from wire.fleet import RunSettings, RunState, Sampling

    return RunSettings(run_id="run-1", state=RunState.RUNNING, num_generations=2, groups_per_step=1, max_staleness=2,
                       max_pending_groups=4, max_game_tokens=64, vocab_size=50, trainer_version=5, updated_at=1.0,
                       sampling=Sampling(max_tokens=4, temperature=1.0, max_turns=2, reply_prefix=""))


def _fleet_group(seq: int = 0):
    from wire.fleet import GameGroup
    from wire.trajectory import Trajectory

    game = Trajectory(prompt_ids=[1, 2, 3], episode_id="e", completion_ids=[4, 5, 6, 7, 8, 9],
                      logprobs=[-0.5, -0.25, 0.0, 0.0, -1.5, -0.125], env_mask=[1, 1, 0, 0, 1, 1], reward=0.5,
                      turn_rewards=[0.25, 0.25], guesses=["crane", ""], versions=[4, 5])
    return GameGroup(run_id="run-1", server_id="srv", boot="b00t", seq=seq, seed=7, games=[game, game], played_s=1.0,
                     created_at=1.0)


@st.composite
def mutate_group(draw) -> object:
    body = _fleet_group().model_dump(mode="json")
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "neighbour", "delete", "duplicate", "token", "number"]))
        event(f"group mutation: {kind}")
        if kind in TREE_EDITS:
            edit_tree(draw, body, kind)
        elif kind == "token":
            game = draw(st.sampled_from(body["games"])) if isinstance(body.get("games"), list) else None
            if isinstance(game, dict) and isinstance(game.get("prompt_ids"), list) and game["prompt_ids"]:
                game["prompt_ids"][0] = draw(st.sampled_from([-5, 49, 50, 10**30, 2**31, "1", 1.0, True]))
        elif kind == "number":
            spots = _positions(body)
            node, key = spots[draw(st.integers(0, len(spots) - 1))]
            node[key] = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", Raw("NaN"), Raw("1e400"), 1e308, 50.0,
                                              -1e308, 10**12, "١٣٠"]))
    return body


def _resealed(body, key: bytes | None) -> bytes:
    import hashlib
    import hmac

    text = dumps(body)
    try:
        parsed = json.loads(text)
        raw = json.dumps(parsed, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, RecursionError):  # NaN, 1e400: the forger cannot hash it as a reader would; hash the text
        raw = text.encode()
    envelope = (f'{{"kind":"fleet-group/1","sha256":"{hashlib.sha256(raw).hexdigest()}","body":{text}'
                + (f',"hmac":"{hmac.new(key, b"fleet-group/1" + bytes([10]) + raw, hashlib.sha256).hexdigest()}"'
                   if key else "") + "}")
    return envelope.encode()


def test_a_crafted_group_is_refused_in_one_line_or_holds_only_what_a_step_can_train_on(tmp_path):
    from trainer_space.config import TrainerConfig
    from trainer_space.fleet import FleetRollouts, FleetRun
    from wire.fleet import FleetMessageError, GameGroup, RunState, fleet_key, group_path
    from fleet.bucket import FleetBucket
    from wire.fleet_checks import check_group

    run = _fleet_run()
    key = fleet_key("rollout-token")
    config = TrainerConfig(bucket=str(tmp_path), rollout_url=None, model="unused", games_per_step=2, num_generations=2,
                           max_tokens=4, max_turns=2, max_game_tokens=64, max_staleness=2, reply_prefix="")
    outcomes: Counter[str] = Counter()

    @seed(SEED)
    @settings(FUZZ, max_examples=max(20, EXAMPLES))
    @given(st.data())
    def fuzz(data):
        signed = data.draw(st.integers(0, 3)) > 0
        crafted = _resealed(data.draw(mutate_group()), key if signed else None)
        note(crafted[:1500])
        try:
            group = decode(crafted, GameGroup, "g.json", key)
            check_group(group, run, 5, "g.json")
        except FleetMessageError as e:
            assert "\n" not in str(e), str(e)
            outcomes[str(e.category)] += 1
            kept = False
        else:
            outcomes["accepted"] += 1
            kept = group.path == group_path("run-1", "srv", "b00t", 0)  # else renamed: refused by the trainer
            for game in group.games:
                assert all(0 <= t < run.vocab_size for t in game.prompt_ids + game.completion_ids)
                assert all(math.isfinite(x) and x <= 0 for x in game.logprobs)
                assert all(math.isfinite(x) and abs(x) <= 1000 for x in [game.reward, *game.turn_rewards])
                assert all(0 <= v <= 5 for v in game.versions) and len(game.prompt_ids + game.completion_ids) <= 64
                torch.tensor(game.prompt_ids), torch.tensor(game.logprobs)
        with tempfile.TemporaryDirectory() as folder:  # the trainer's rollout function over it and a good group
            bucket = FleetBucket(folder, secret="rollout-token")
            fleet_run = FleetRun(config, bucket, run_id="run-1")
            fleet_run.know_vocabulary(run.vocab_size)
            fleet_run.send(RunState.RUNNING, 5)
            bucket.bucket.write(group_path("run-1", "srv", "b00t", 0), crafted)
            good = bucket.write_group(_fleet_group(seq=1))
            fleet = FleetRollouts(config, fleet_run, lambda: 5)
            taken = [g.path for g in fleet.take(1)]
            assert taken == [good] or (kept and taken == [group_path("run-1", "srv", "b00t", 0)]), taken
            assert sum(fleet.refused.values()) == (0 if kept else 1), dict(fleet.refused)

    fuzz()
    print(f"fleet groups: {dict(outcomes)}")  # shown with -s
    assert outcomes["invalid fields"] > 0 and outcomes["accepted"] > 0


# -- what reaches a terminal, in a subprocess (issue 37) --------------------------------------------------------------


def test_no_traceback_and_no_control_character_reaches_a_terminal_from_crafted_files(ranked, tmp_path):
    """The command line run as a user runs it, on the issue's crafted manifests and index files: one printable line
    per warning or error, never a traceback."""
    import subprocess
    import sys

    from ._ranked import RAW, forge
    from ._capped import ROOT

    escape = "\x1b]0;owned\x07\x1b[2J\u202e\x9b31m"
    buckets = {
        "escapes in a path": forge(ranked["names"], tmp_path / "a", lambda b: b["versions"][2]["delta"][0].update(
            path=f"versions/{escape}.safetensors")),
        "escapes in kind and hash": forge(ranked["names"], tmp_path / "b", lambda b: b["versions"][2].update(
            kind=escape, state_hash=escape)),
        "a version of 1e400": forge(ranked["split"], tmp_path / "c", lambda b: b["versions"][2].update(
            version=RAW + "1e400")),
        "a name the state lacks": forge(ranked["names"], tmp_path / "d", lambda b: b["shards"][1].append(escape)),
        "rank 3": forge(ranked["names"], tmp_path / "e", lambda b: b["versions"][2]["delta"][1].update(rank=3)),
    }
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "x.delta").write_bytes(real_file("ctx"))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {escape: [escape]}}))
    runs = [(name, ["log", "--bucket", str(b)]) for name, b in buckets.items()]
    runs += [(name, ["pull", "--bucket", str(b), "-o", str(tmp_path / "out.safetensors")]) for name, b in buckets.items()]
    runs.append(("an index with escapes", ["verify", str(tmp_path / "x.delta"), "--base", str(model)]))
    for name, args in runs:
        out = subprocess.run([sys.executable, "-m", "delta", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode in (0, 1), (name, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr, (name, out.stderr)
        assert _printable(out.stdout) and _printable(out.stderr), (name, repr(out.stdout + out.stderr))
        assert out.returncode == 0 or out.stderr.splitlines()[-1].startswith("error: "), (name, out.stderr)
