"""Crafted delta files, as anyone who can write to a bucket could make them: each is refused with one
clear error, without allocating anything the size of what it claims, and the state stays as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch
import zstandard
from safetensors.torch import load as st_load

import delta
from delta.format import read_header_json, serialize_safetensors
from delta.inspect import inspect_delta

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
    refused_lightly(clone(old), forged, rf"tensor '{table[0]['name']}': 1000000000000 changed elements in a tensor of")


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
