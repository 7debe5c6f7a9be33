"""Crafted delta files, as anyone who can write to a bucket could make them: each is refused with one
clear error, without allocating anything the size of what it claims, and the state stays as it was."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
import torch
import zstandard
from safetensors.torch import load as st_load
from safetensors.torch import save

from delta import Bucket
import delta
from delta.cli import main
from delta.codecs._streams import pack
from delta.format import MAX_HEADER_BYTES, header_limit, read_header_json, serialize_safetensors
from delta.inspect import inspect_delta

from ._forgery import Raw, deep, dumps, forge_duplicate, forge_reorder, join, split
from ._states import adam_like, clone, states_equal

MB = 1 << 20


@pytest.fixture(scope="module")
def pair():
    return adam_like(n=20_000, lr=5e-5)


def forge(data: bytes, blobs: dict[str, bytes] | None = None, meta: dict[str, str] | None = None,
          tensors: list[dict] | None = None) -> bytes:
    """The file `data` with some streams, metadata keys or tensor table rows replaced."""
    header = read_header_json(data)["__metadata__"]
    streams = {k: v for k, v in st_load(data).items()}
    for name, raw in (blobs or {}).items():
        streams[name] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    header.update(meta or {})
    if tensors is not None:
        header["tensors"] = json.dumps(tensors)
    return serialize_safetensors(streams, header)


def refused_lightly(state: dict, data: bytes, match: str) -> None:
    """Applying `data` raises DeltaFormatError matching `match`, peaks under 20 MB, leaves `state` alone."""
    before = clone(state)
    tracemalloc.start()
    try:
        with pytest.raises(delta.DeltaFormatError, match=match):
            delta.apply(state, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * MB, f"refusing took {peak / MB:.0f} MB"
    assert states_equal(state, before)


@pytest.mark.parametrize("stream", ["chunks", "models"])
def test_a_decompression_bomb_is_refused_before_it_is_inflated(pair, stream):
    old, new = pair
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(64 * MB))
    assert len(bomb) < 10_000
    refused_lightly(clone(old), forge(delta.diff(old, new), {stream: bomb}),
                    rf"stream '{stream}' declares 67108864 bytes, the header allows at most \d+")


def test_a_frame_without_a_declared_size_is_refused(pair):
    old, new = pair
    sizeless = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 400)
    refused_lightly(clone(old), forge(delta.diff(old, new), {"chunks": sizeless}), r"stream 'chunks' declares no size")


def test_counts_larger_than_the_tensor_are_refused(pair):
    old, new = pair
    data = delta.diff(old, new)
    table = json.loads(read_header_json(data)["__metadata__"]["tensors"])
    table[0]["changed"] = 10**12
    forged = forge(data, meta={"changed": str(sum(t["changed"] for t in table))}, tensors=table)
    refused_lightly(clone(old), forged, rf"tensor '{table[0]['name']}': 'changed' is 1000000000000, not a whole number "
                    r"in \[1, 1000\]")


def test_a_huge_claimed_tensor_is_refused_by_inspect_without_allocating(pair):
    old, new = pair
    data = delta.diff(old, new)
    table = json.loads(read_header_json(data)["__metadata__"]["tensors"])
    table[0]["shape"], table[0]["changed"] = [2**40], 2**39
    forged = forge(data, meta={"changed": str(sum(t["changed"] for t in table)), "total": str(2**41)}, tensors=table)
    tracemalloc.start()
    try:
        with pytest.raises(delta.DeltaFormatError, match=r"chunk row \d+ is malformed|stream 'chunks' ends after"):
            inspect_delta(forged)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * MB


def test_garbage_words_never_apply(pair):
    old, new = pair
    data = delta.diff(old, new)
    words = st_load(data)["words"].numpy()
    rng = np.random.default_rng(0)
    for _ in range(20):
        noise = rng.integers(0, 256, words.size, dtype=np.uint8).tobytes()
        state = clone(old)
        with pytest.raises(delta.DeltaError):
            delta.apply(state, forge(data, {"words": noise}))
        assert states_equal(state, old)


def test_cli_refuses_a_crafted_file_in_one_line(pair, tmp_path):
    old, new = pair
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(64 * MB))
    path = tmp_path / "bomb.delta"
    path.write_bytes(forge(delta.diff(old, new), {"chunks": bomb}))
    for command in (["inspect", str(path)], ["verify", str(path)]):
        out = subprocess.run([sys.executable, "-m", "delta", *command], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert "declares 67108864 bytes" in out.stderr + out.stdout


def test_inspect_escapes_control_characters_in_names(tmp_path):
    old = {"evil\x1b[2J\x07name": torch.zeros(10, dtype=torch.bfloat16)}
    new = {"evil\x1b[2J\x07name": torch.ones(10, dtype=torch.bfloat16)}
    text = inspect_delta(delta.diff(old, new)).render()
    assert "\x1b" not in text and "\x07" not in text and "evil\\x1b[2J\\x07name" in text


# -- issue 22: every malformed file refused, in one line, before anything the size of a claim ---------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m delta ARGS` in this process (an exception that escapes `main` would be a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def one_line_refusal(out: subprocess.CompletedProcess, match: str) -> None:
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert all(c.isprintable() for c in out.stderr.rstrip("\n")), repr(out.stderr)
    assert re.search(match, out.stderr), out.stderr


@pytest.mark.parametrize("codec", ["ctx", "gap"])
def test_a_tensor_listed_twice_is_refused_though_its_streams_decode(pair, codec, tmp_path):
    old, new = pair
    forged = forge_duplicate(old, new, "layers.0.w", codec)
    refused_lightly(clone(old), forged, r"tensor 'layers.0.w': listed twice: the table lists each tensor once")
    delta.save_state(old, str(tmp_path / "old.safetensors"))
    (tmp_path / "dup.delta").write_bytes(forged)
    out = cli("apply", str(tmp_path / "old.safetensors"), str(tmp_path / "dup.delta"), "-o", str(tmp_path / "x"))
    one_line_refusal(out, "listed twice")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("codec", sorted(delta.CODECS))
def test_a_table_out_of_name_order_is_refused(pair, codec):
    old, new = pair
    refused_lightly(clone(old), forge_reorder(old, new, codec), r"listed after '.*': .* sorted by name")


def test_one_entry_repeated_many_times_costs_no_time():
    """The CPU amplification of issue 22: one entry repeated K times re-scanned the tensor K times (a 206 KB
    file on a 2**24-element tensor took 23.7 s). Refused from the header now: by name, or by its size."""
    old = {"w": torch.zeros(1 << 24, dtype=torch.bfloat16)}
    new = {"w": old["w"].clone()}
    new["w"][::4096] = 1
    data = delta.diff(old, new, codec="ctx")
    for k, message in ((400, "listed twice"), (2000, r"header is \d+ bytes; at most \d+ are allowed here")):
        p = split(data)
        row = json.loads(p.meta["tensors"])[0]
        p.meta["tensors"] = json.dumps([row] * k)
        p.meta["changed"] = str(k * row["changed"])
        p.meta["total"] = str(k * (1 << 24))
        start = time.perf_counter()
        refused_lightly(clone(old), join(p), message)
        assert time.perf_counter() - start < 2


@pytest.mark.parametrize("where", ["header", "tensors"])
def test_json_nested_a_thousand_deep_is_refused(pair, where, tmp_path):
    old, new = pair
    p = split(delta.diff(old, new))
    if where == "header":
        p.extra["x"] = Raw(deep(1000))
    else:
        p.meta["tensors"] = deep(1000)
    refused_lightly(clone(old), join(p), rf"{'header' if where == 'header' else 'metadata .tensors.'} is nested deeper "
                    "than 3 levels")
    (tmp_path / "deep.delta").write_bytes(join(p))
    for command in ("inspect", "verify"):
        one_line_refusal(cli(command, str(tmp_path / "deep.delta")), "nested deeper than 3 levels")


@pytest.mark.parametrize("field, value, message", [
    ("name", ["layers.0.w"], "'name' is a JSON list, not a string"),
    ("name", 7, "'name' is a JSON number, not a string"),
    ("dtype", ["bfloat16"], "'dtype' is a JSON list, not a string"),
    ("dtype", 16, "'dtype' is a JSON number, not a string"),
    ("shape", [40.9], r"holds the number '40.9'; only whole numbers are allowed"),
    ("shape", ["1000"], "shape .* is not a list of at most 64 whole numbers"),
    ("changed", 40.9, "holds the number '40.9'"),
    ("changed", "13", "'changed' is '13', not a whole number"),
    ("changed", True, "'changed' is True, not a whole number"),
    ("form", None, "'form' is a JSON true/false/null, not a string"),
])
def test_fields_of_the_wrong_json_type_are_refused(pair, field, value, message):
    old, new = pair
    data = delta.diff(old, new)
    p = split(data)
    table = json.loads(p.meta["tensors"])
    table[-1][field] = value
    p.meta["tensors"] = json.dumps(table)
    refused_lightly(clone(old), join(p), message)


@pytest.mark.parametrize("value", ["40.9", "١٣٠", " 13_288 ", "８", "+5", "007", "1e3", "13288\n", "-5", ""])
def test_counts_must_be_canonical_decimal(pair, value):
    old, new = pair
    p = split(delta.diff(old, new))
    p.meta["changed"] = value
    refused_lightly(clone(old), join(p), "metadata 'changed' is .*not a whole number in canonical decimal form")


def test_a_raw_count_of_ten_to_the_400_is_refused_by_inspect(pair, tmp_path):
    old, new = pair
    p = split(delta.diff(old, new, codec="raw"))
    table = json.loads(p.meta["tensors"])
    p.meta["tensors"] = dumps([{**table[0], "changed": Raw("1" + "0" * 400)}] + table[1:])
    with pytest.raises(delta.DeltaFormatError, match="larger than 9223372036854775807"):
        inspect_delta(join(p))
    (tmp_path / "big.delta").write_bytes(join(p))
    one_line_refusal(cli("inspect", str(tmp_path / "big.delta")), "larger than")


def test_a_huge_header_is_refused_without_parsing_it(pair, tmp_path):
    old, new = pair
    p = split(delta.diff(old, new))
    p.extra["padding"] = "x" * (20 * MB)
    data = join(p)
    limit = header_limit(old)
    assert limit < 100_000
    start = time.perf_counter()
    refused_lightly(clone(old), data, rf"header is \d+ bytes; at most {limit} are allowed here")
    assert time.perf_counter() - start < 1
    with pytest.raises(delta.DeltaFormatError, match=rf"at most {MAX_HEADER_BYTES} are allowed"):
        inspect_delta(data)


def test_a_models_stream_is_bounded_by_the_classes_the_chunks_use(tmp_path):
    """Issue 22: an 8.5 KB models stream on a delta naming four dtype widths made the reader allocate ~1 GB."""
    g = torch.Generator().manual_seed(0)
    old = {"a.f8": torch.randn(4000, generator=g).to(torch.float8_e4m3fn),
           "b.bf16": torch.randn(4000, generator=g).bfloat16(), "c.f32": torch.randn(4000, generator=g),
           "d.f64": torch.randn(4000, generator=g, dtype=torch.float64)}
    new = {k: (v.float() * 1.01).to(v.dtype) for k, v in old.items()}
    data = delta.diff(old, new)
    # Every model the widths could have (the old bound): refused as models no chunk uses, or as too large.
    table = []
    for width, classes in ((8, 16), (16, 256), (32, 256), (64, 2048)):
        for kind in (0, 1):
            for c in range(classes):
                table += [kind, width, c, 1, 5, 1 << 15]
    models = pack(np.asarray(table, np.uint32), level=19)
    assert len(models) < 100_000
    refused_lightly(clone(old), forge(data, {"models": models}), r"stream 'models' (declares \d+ bytes, the header "
                    r"allows at most \d+|has a model no chunk of this delta uses)")
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(256 * MB))
    refused_lightly(clone(old), forge(data, {"models": bomb}), r"stream 'models' declares 268435456 bytes, the header "
                    r"allows at most \d+")


def test_bytes_after_a_zstd_frame_are_refused(pair):
    old, new = pair
    data = delta.diff(old, new)
    chunks = st_load(data)["chunks"].numpy().tobytes()
    refused_lightly(clone(old), forge(data, {"chunks": chunks + b"\0"}), "stream 'chunks' is corrupt or has bytes "
                    "after its zstd frame")
    refused_lightly(clone(old), forge(data, {"chunks": chunks + chunks}), "bytes after its zstd frame")


def test_raw_counts_must_match_their_positions_and_unlisted_blobs_are_refused(pair):
    old, new = pair
    data = delta.diff(old, new, codec="raw")
    p = split(data)
    table = json.loads(p.meta["tensors"])
    name = table[0]["name"]
    short = split(data)
    short.blobs[f"{name}.indices"][2] = short.blobs[f"{name}.indices"][2][:-4]
    short.blobs[f"{name}.indices"][1] = [table[0]["changed"] - 1]
    refused_lightly(clone(old), join(short), r"indices are torch.int32 \(\d+,\), the header needs int32")
    extra = split(data)
    extra.blobs["ghost.indices"] = ["I32", [1], b"\0\0\0\0"]
    refused_lightly(clone(old), join(extra), r"streams do not match the header: not listed by it \['ghost.indices'\]")
    ctx = split(delta.diff(old, new))
    ctx.blobs["extra"] = ["U8", [1], b"\0"]
    refused_lightly(clone(old), join(ctx), r"not listed by it \['extra'\]")


def test_verify_without_a_base_decodes_every_chunk_and_says_what_it_checked(pair, tmp_path):
    old, new = pair
    for codec in ("ctx", "gap", "raw"):
        (tmp_path / f"{codec}.delta").write_bytes(delta.diff(old, new, codec=codec))
        out = cli("verify", str(tmp_path / f"{codec}.delta"))
        assert out.returncode == 0 and out.stdout.startswith("OK ") and "Needs --base:" in out.stdout
    assert "every chunk's rANS words decoding exactly" in cli("verify", str(tmp_path / "ctx.delta")).stdout
    data = delta.diff(old, new)
    words = bytearray(st_load(data)["words"].numpy().tobytes())
    words[len(words) // 2] ^= 0x10
    (tmp_path / "bad.delta").write_bytes(forge(data, {"words": bytes(words)}))
    one_line_refusal(cli("verify", str(tmp_path / "bad.delta")), "does not decode")


def test_hashes_and_metadata_never_reach_the_terminal_unescaped(pair, tmp_path):
    old, new = pair
    data = delta.diff(old, new)
    for key, value in (("base_hash", "xxh3-128:\x1b[2J" + "0" * 28), ("target_hash", "\x1b]0;pwned\x07"),
                       ("codec", "\x1b[31mctx")):
        (tmp_path / "evil.delta").write_bytes(forge(data, meta={key: value}))
        for command in (["inspect"], ["verify"], ["apply", str(tmp_path / "old.safetensors")]):
            args = [*command, str(tmp_path / "evil.delta")]
            args += ["-o", str(tmp_path / "x")] if command[0] == "apply" else []
            delta.save_state(old, str(tmp_path / "old.safetensors"))
            out = cli(*args)
            assert out.returncode == 1 and "\x1b" not in out.stderr + out.stdout and "\\x1b" in out.stderr, out.stderr


def test_a_foreign_file_with_control_characters_in_names_is_shown_escaped():
    name = "evil\x1b[2J\x07name"
    data = save({f"{name}.indices": torch.tensor([1], dtype=torch.int32), f"{name}.values": torch.ones(1)})
    text = inspect_delta(data).render()
    assert "\x1b" not in text and "evil\\x1b[2J\\x07name" in text
    with pytest.raises(delta.StateMismatchError) as e:
        delta.apply({"x": torch.zeros(3)}, data)
    assert "\\x1b" in str(e.value)


def test_a_forged_version_in_a_bucket_never_advances_a_subscriber(pair, tmp_path):
    """The duplicated-entry bypass through a bucket: the forger rewrites the file and the manifest to match, and signs
    it with the trainer's key (a stranger's signature is refused first: tests/test_trust.py)."""
    from dataclasses import replace

    from ._signed import signed

    from delta import Publisher, PublisherConfig
    from delta import Subscriber
    from delta import read_manifest
    from delta.bucket.manifest import file_ref, write_manifest
    from delta.storage import open_storage

    old, new = pair
    with Publisher(str(tmp_path), PublisherConfig(anchor_every=1000)) as pub:
        for s in (old, new):
            pub.publish(s)
            assert pub.flush(timeout=60)
    storage = Bucket.open(str(tmp_path))
    manifest = read_manifest(storage)
    entry = manifest.get(2)
    forged = forge_duplicate(old, new, "layers.0.w", "ctx")
    target = json.loads(forged[8:8 + int.from_bytes(forged[:8], "little")])["__metadata__"]["target_hash"]
    storage.write(entry.delta[0].path, forged)
    write_manifest(storage, signed(storage, replace(manifest, commit=manifest.commit + 1, versions=(
        manifest.versions[0], replace(entry, delta=(file_ref(entry.delta[0].path, forged),), state_hash=target)))))
    reader = Subscriber(str(tmp_path), clone(old), version=1)
    with pytest.raises(delta.NoPathError):
        reader.sync()
    reader.close()
    assert reader.version == 1 and states_equal(reader.state, old)
    assert reader.status().failures >= 1


@pytest.mark.parametrize("fmt", [None, "sparse_weight_patch"])
def test_a_delta_whose_format_is_changed_does_not_apply_without_its_hashes(pair, fmt):
    """Found by the fuzz test: without `format`, a raw delta looked like TRL's blog layout, which carries no
    hashes, so it applied without its target hash being checked."""
    old, new = pair
    p = split(delta.diff(old, new, codec="raw"))
    if fmt is None:
        del p.meta["format"]
    else:
        p.meta["format"] = fmt
    refused_lightly(clone(old), join(p), r"but the file carries 'delta-weights' keys \['base_hash', 'format_version', "
                    r"'target_hash', 'tensors'\]: refused rather than read without its hashes")
    blog = split(delta.diff(old, new, codec="raw"))
    blog.meta = {"num_params": "3", "extra": "x"}
    refused_lightly(clone(old), join(blog), "metadata without a 'format' has keys")
