"""The file format itself: golden files, plain safetensors readers, header metadata."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

import delta

from ._states import clone, states_equal
from .make_golden import HERE, golden_states

CODECS = sorted(delta.CODECS)


@pytest.mark.parametrize("codec", CODECS)
def test_golden_files_still_apply(codec):
    """Files written by this format version must keep decoding, whatever changes in the encoder, and verify with the
    hash they carry."""
    old, new = golden_states()
    base = delta.load_state(os.path.join(HERE, "golden_base.safetensors"))
    assert states_equal(base, old)
    result = delta.apply(base, os.path.join(HERE, f"golden_v3.{codec}.delta"))
    assert states_equal(base, new)
    assert result.digest.hexdigest.startswith("sum128:")


@pytest.mark.parametrize("codec", CODECS)
def test_golden_bytes_are_stable(codec):
    """Same input, same bytes: the encoder (threads included) writes exactly the golden file."""
    old, new = golden_states()
    with open(os.path.join(HERE, f"golden_v3.{codec}.delta"), "rb") as f:
        want = f.read()
    for workers in (1, 3):
        assert delta.diff(old, new, codec=codec, version=1, base_version=0, workers=workers) == want


@pytest.mark.parametrize("codec", CODECS)
def test_version_1_files_are_refused_with_what_to_do(codec):
    base = delta.load_state(os.path.join(HERE, "golden_base.safetensors"))
    before = clone(base)
    with pytest.raises(delta.DeltaFormatError, match=r"format version '1' is not supported by this reader \(supports 3\); "
                       r"it was written by an older `delta`: publish an anchor"):
        delta.apply(base, os.path.join(HERE, f"golden_v1.{codec}.delta"))
    assert states_equal(base, before)


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
    assert meta["format"] == "delta-weights" and meta["format_version"] == "3" and meta["codec"] == codec
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


def test_the_headers_of_several_ranks_merge_into_one_sorted_header_with_summed_counts():
    """Two ranks' deltas of one version (disjoint tensors), as `diff` writes them; the trainer's payload log and
    the rollout's heatmap both read the merge."""
    old = {n: torch.zeros(8, dtype=torch.bfloat16) for n in ("a", "b", "c", "d")}
    new = {n: t.clone() for n, t in old.items()}
    new["a"][:1] = 1
    new["b"][:3] = 1
    new["c"][:2] = 1
    ranks = [{"d": None, "a": None}, {"c": None, "b": None}]  # each rank's names, in no order
    headers = [delta.read_delta(delta.diff({n: old[n] for n in r}, {n: new[n] for n in r}, version=2,
                                           base_version=1))[0] for r in ranks]
    merged = delta.DeltaHeader.merged(headers)
    assert [t.name for t in merged.tensors] == ["a", "b", "c"]  # changed tensors of both ranks, by name
    assert (merged.changed, merged.total) == (1 + 3 + 2, 4 * 8)
    assert (merged.version, merged.base_version, merged.codec) == (2, 1, headers[0].codec)
    assert delta.DeltaHeader.merged(headers[:1]) is headers[0]
