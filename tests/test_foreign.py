"""Delta files from TRL's AsyncGRPO delta branches apply like ours, with the checks their layouts carry.

Golden files (tests/data/trl_*.safetensors, `python -m tests.make_golden trl`) and fresh files are
written the way those branches write them (`tests/_trl_writers.py`), never by this project's writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load, load_file, save, save_file

import delta
from delta import DeltaFormatError, IntegrityError
from delta.inspect import check_delta, inspect_delta

from . import _trl_writers as trl
from ._states import clone, states_equal
from .make_golden import HERE, TRL_FILES, trl_golden_states


def golden(name: str) -> bytes:
    with open(os.path.join(HERE, f"{name}.safetensors"), "rb") as f:
        return f.read()


def same_file(a: bytes, b: bytes) -> bool:
    """Same tensors and metadata (safetensors' writer orders metadata through a hash map: bytes vary)."""
    return patch_metadata(a) == patch_metadata(b) and states_equal(load(a), load(b))


def test_golden_files_match_the_writers():
    """The golden files are what the TRL-layout writers make today (so both stay as TRL wrote them)."""
    states = trl_golden_states()
    assert states_equal(delta.load_state(os.path.join(HERE, "trl_base.safetensors")), states[0])
    assert same_file(golden("trl_earlier_patch_v2"), trl.earlier_patch(states[1], states[2], 2, anchor_step=1))
    assert same_file(golden("trl_later_gap_v2"), trl.later_patch(states[1], states[2], 2, "gap_delta"))
    assert same_file(golden("trl_middle_anchor_v1"), trl.middle_patch(None, states[1], 1))


@pytest.mark.parametrize("layout", ["earlier", "middle", "later"])
def test_every_golden_layout_applies_an_anchor_then_a_patch(layout):
    states = trl_golden_states()
    state = clone(states[0])
    result = delta.apply(state, golden(f"trl_{layout}_anchor_v1"))
    assert states_equal(state, states[1]) and result.header.foreign and result.header.version == 1
    assert result.changed == sum(t.numel() for t in states[1].values())
    for patch in [name for name in TRL_FILES if name.startswith(f"trl_{layout}_") and name.endswith("_v2")]:
        mine = clone(state)
        result = delta.apply(mine, golden(patch))
        assert states_equal(mine, states[2]), patch
        assert result.header.version == 2 and result.digest.hexdigest == delta.state_digest(states[2]).hexdigest
        assert result.header.checksum == (trl.bf16_checksum(states[2]) if layout == "earlier" else "")


def test_the_earlier_layout_has_no_sparse_key_and_its_checksum_is_verified():
    states = trl_golden_states()
    data = golden("trl_earlier_patch_v2")
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    assert "sparse" not in meta and meta["format"] == "sparse_weight_patch" and len(meta["checksum_sha256"]) == 64
    assert json.loads(meta["changed_params"]) == ["model.embed.weight", "model.layers.0.mlp.weight"]
    header, _, _ = delta.decode(data, clone(states[1]))
    assert header.checksum == meta["checksum_sha256"] and header.base_version == 1
    # The same patch with another state's checksum: refused, nothing written.
    tensors = load(data)
    forged = save(tensors, metadata={**meta, "checksum_sha256": trl.bf16_checksum(states[1])})
    state = clone(states[1])
    with pytest.raises(IntegrityError, match="checksum_sha256.*nothing was written"):
        delta.apply(state, forged)
    assert states_equal(state, states[1])
    # Applied to another base than the one it was made for: positions fit, the checksum does not.
    state = clone(states[0])
    with pytest.raises(IntegrityError, match="checksum_sha256"):
        delta.apply(state, data)
    assert states_equal(state, states[0])


def test_an_anchor_checkpoint_with_a_wrong_checksum_is_refused():
    states = trl_golden_states()
    data = golden("trl_earlier_anchor_v1")
    tensors = load(data)
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    state = clone(states[0])
    with pytest.raises(IntegrityError, match="anchor does not match its checksum_sha256"):
        delta.apply(state, save(tensors, metadata=meta))
    assert states_equal(state, states[0])


@pytest.mark.parametrize("encoding", ["raw", "gap_delta"])
def test_later_patches_apply_bit_exact_with_wide_gaps(encoding):
    old, new, _ = trl.trl_states(seed=1, steps=2)
    data = trl.later_patch(old, new, 7, encoding)
    if encoding == "gap_delta":
        assert {t.dtype for t in load(data).values() if t.dtype != torch.bfloat16} == {torch.uint16, torch.uint32}
    state = clone(old)
    result = delta.apply(state, data)
    assert states_equal(state, new) and result.header.foreign and result.header.version == 7
    assert result.digest.hexdigest == delta.state_digest(new).hexdigest


def test_the_earlier_layout_applies_from_the_command_line_and_says_what_it_checked(tmp_path):
    states = trl_golden_states()
    save_file(states[1], str(tmp_path / "v1.safetensors"))
    (tmp_path / "v2.safetensors").write_bytes(golden("trl_earlier_patch_v2"))
    out = subprocess.run([sys.executable, "-m", "delta", "apply", str(tmp_path / "v1.safetensors"),
                          str(tmp_path / "v2.safetensors"), "-o", str(tmp_path / "new.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "TRL checksum_sha256 matched" in out.stdout
    assert states_equal(load_file(str(tmp_path / "new.safetensors")), states[2])


def test_verify_and_inspect_without_a_base():
    _, what = check_delta(golden("trl_later_gap_v2"))
    assert what.startswith("well-formed TRL patch (no hashes)") and "Needs --base:" in what
    _, what = check_delta(golden("trl_earlier_patch_v2"))
    assert "with a checksum_sha256" in what and "checksum of the state after applying" in what
    _, what = check_delta(golden("trl_earlier_anchor_v1"))
    assert what.startswith("well-formed TRL anchor")
    text = inspect_delta(golden("trl_earlier_patch_v2")).render()
    assert "foreign TRL-layout file" in text and "checksum      sha256:" in text


def test_an_empty_patch_is_refused_and_nothing_is_written(tmp_path):
    states = trl_golden_states()
    data = golden("trl_earlier_empty_v3")
    assert set(load(data)) == {"__empty_delta__"}
    state = clone(states[2])
    with pytest.raises(DeltaFormatError, match="this patch changes nothing.*nothing to apply, nothing written"):
        delta.apply(state, data)
    assert states_equal(state, states[2])
    save_file(states[2], str(tmp_path / "v2.safetensors"))
    (tmp_path / "v3.safetensors").write_bytes(data)
    out = subprocess.run([sys.executable, "-m", "delta", "apply", str(tmp_path / "v2.safetensors"),
                          str(tmp_path / "v3.safetensors"), "-o", str(tmp_path / "out.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "changes nothing" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "out.safetensors").exists()
    # A later-layout patch whose every tensor is empty: the same.
    empty = trl.later_patch(states[2], states[2], 3)
    with pytest.raises(DeltaFormatError, match="changes nothing"):
        delta.apply(clone(states[2]), empty)


def patch_metadata(data: bytes) -> dict[str, str]:
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]


@pytest.mark.parametrize("change, message", [
    ({"encoding": "nvcomp_cascaded"}, "need nvCOMP on a GPU to decode; publish with encoding 'gap_delta' or 'raw'"),
    ({"version": "2"}, "sparse_weight_patch version '2' is not supported"),
    ({"encoding": "zstd"}, "unknown sparse_weight_patch encoding 'zstd'"),
    ({"sparse": "False"}, r"metadata 'sparse' is 'False' \(an anchor: whole tensors\), but the tensors are named"),
    ({"sparse": "yes"}, "metadata 'sparse' is 'yes', expected 'True' or 'False'"),
    ({"changed_params": '["model.embed.weight", "ghost"]'}, "metadata 'changed_params' names"),
    ({"model_version": "٧"}, "metadata 'model_version' is '٧', not a whole number in canonical decimal form"),
    ({"total_changed_elements": "1"}, "metadata 'total_changed_elements' is 1, the file holds"),
    ({"num_changed_params": " 3"}, "metadata 'num_changed_params' is ' 3', not a whole number"),
])
def test_later_patches_this_reader_cannot_use_are_refused_with_what_to_do(change, message):
    old, new = trl_golden_states()[1:]
    data = golden("trl_later_raw_v2")
    state = clone(old)
    with pytest.raises(DeltaFormatError, match=message):
        delta.apply(state, save(load(data), metadata={**patch_metadata(data), **change}))
    assert states_equal(state, old)


@pytest.mark.parametrize("change, message", [
    ({"changed_params": '["model.embed.weight"]'}, "metadata 'changed_params' names"),
    ({"changed_params": '["model.embed.weight", "model.embed.weight", "model.layers.0.mlp.weight"]'},
     "metadata 'changed_params' names"),
    ({"changed_params": "model.embed.weight"}, "metadata 'changed_params' is not valid JSON"),
    ({"checksum_sha256": "\x1b[31mred"}, r"metadata 'checksum_sha256' is '\\x1b\[31mred', not 64 lowercase hex"),
    ({"encoding": "raw"}, "metadata 'encoding' .* belongs to `.idx`/`.val` patches"),
    ({"prev_model_version": "1.0"}, "metadata 'prev_model_version' is '1.0', not a whole number"),
])
def test_earlier_patches_that_break_their_own_layout_are_refused(change, message):
    old = trl_golden_states()[1]
    data = golden("trl_earlier_patch_v2")
    state = clone(old)
    with pytest.raises(DeltaFormatError, match=message):
        delta.apply(state, save(load(data), metadata={**patch_metadata(data), **change}))
    assert states_equal(state, old)


def test_malformed_patch_tensors_are_refused_and_the_state_untouched():
    old, new = trl_golden_states()[1:]
    data = golden("trl_later_raw_v2")
    meta, good = patch_metadata(data), load(data)
    name = "model.embed.weight"
    for tensors, message in [
        ({k: v for k, v in good.items() if k != f"{name}.val"}, r"needs exactly `\{name\}.idx` and `\{name\}.val`"),
        ({**good, f"{name}.idx": good[f"{name}.idx"][:-1]}, "must be 1-D and of one length"),
        ({**good, f"{name}.idx": good[f"{name}.idx"].to(torch.int64)}, "stores int32 positions"),
        ({**good, f"{name}.idx": torch.full_like(good[f"{name}.idx"], 10**8)}, "not strictly increasing|out of range"),
        ({**good, f"{name}.idx": good[f"{name}.idx"].flip(0).contiguous()}, "not strictly increasing"),
        ({**good, "extra.weight": torch.zeros(3)}, "needs `{name}.idx` \\+ `{name}.val`"),
    ]:
        state = clone(old)
        with pytest.raises(DeltaFormatError, match=message):
            delta.apply(state, save(tensors, metadata=meta))
        assert states_equal(state, old)


def test_blog_layout_without_metadata_still_applies():
    old, new = trl_golden_states()[1:]
    tensors = {}
    for name in old:
        pos = (old[name] != new[name]).reshape(-1).nonzero()[:, 0].to(torch.int32)
        if pos.numel():
            tensors[f"{name}.indices"], tensors[f"{name}.values"] = pos, new[name].reshape(-1)[pos.long()]
    state = clone(old)
    delta.apply(state, save(tensors))
    assert states_equal(state, new)
