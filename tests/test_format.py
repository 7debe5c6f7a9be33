"""The file format itself: golden files, plain safetensors readers, header metadata."""

from __future__ import annotations

import json
import os

import pytest
from safetensors import safe_open

import delta

from ._states import clone, states_equal
from .make_golden import HERE, golden_states

CODECS = sorted(delta.CODECS)


@pytest.mark.parametrize("codec", CODECS)
def test_golden_files_still_apply(codec):
    """Files written by format version 1 must keep decoding, whatever changes in the encoder."""
    old, new = golden_states()
    base = delta.load_state(os.path.join(HERE, "golden_base.safetensors"))
    assert states_equal(base, old)
    delta.apply(base, os.path.join(HERE, f"golden_v1.{codec}.delta"))
    assert states_equal(base, new)


def test_raw_golden_bytes_are_stable():
    old, new = golden_states()
    with open(os.path.join(HERE, "golden_v1.raw.delta"), "rb") as f:
        assert delta.diff(old, new, codec="raw", version=1, base_version=0) == f.read()


@pytest.mark.parametrize("codec", CODECS)
def test_plain_safe_open_reads_the_header(codec, tmp_path):
    old, new = golden_states()
    path = tmp_path / "v1.delta"
    path.write_bytes(delta.diff(old, new, codec=codec, version=1, base_version=0))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        names = list(f.keys())
        for name in names:
            f.get_tensor(name)
    assert meta["format"] == "delta-weights" and meta["format_version"] == "1" and meta["codec"] == codec
    assert meta["version"] == "1" and meta["base_version"] == "0"
    assert meta["base_hash"] == delta.state_digest(old).hexdigest
    assert meta["target_hash"] == delta.state_digest(new).hexdigest
    assert int(meta["total"]) == sum(t.numel() for t in old.values())
    table = json.loads(meta["tensors"])
    assert [t["name"] for t in table] == sorted(t["name"] for t in table)
    assert int(meta["changed"]) == sum(t["changed"] for t in table) > 0
    if codec == "raw":
        assert set(names) == {f"{t['name']}.{kind}" for t in table for kind in ("indices", "values")}


def test_unknown_codec_in_header_is_a_format_error():
    old, new = golden_states()
    data = delta.diff(old, new).replace(b'"codec":"ctx"', b'"codec":"zzz"')
    with pytest.raises(delta.DeltaFormatError, match="unknown codec 'zzz'"):
        delta.apply(clone(old), data)
