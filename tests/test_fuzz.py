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

from delta import Publisher, PublisherConfig, Subscriber
import delta
from delta.bucket.manifest import file_ref, read_manifest, write_manifest
from delta.cli import main
from delta.format import read_header_json
from delta.inspect import inspect_delta
from delta.storage import open_storage

from . import _trl_writers as trl
from ._forgery import Parts, Raw, deep, dumps, forge_duplicate, forge_reorder, join, split
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
                  "indices", "xxh3-128:" + "0" * 32, "xxh3-128:\x1b[31m" + "0" * 27, "[]", '["a.w"]',
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
    manifest = read_manifest(open_storage(str(bucket)))
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
            storage = open_storage(folder)
            storage.write(entry.delta[0].path, mutated)  # the forger rewrites the file and the manifest to match
            forged = replace(entry, delta=(file_ref(entry.delta[0].path, mutated),),
                             state_hash=target if target else entry.state_hash)
            m = read_manifest(storage)
            write_manifest(storage, replace(m, commit=m.commit + 1, versions=(m.versions[0], forged)))
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
