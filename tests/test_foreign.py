"""Delta files from TRL's delta-weight-sync branches (`sparse_weight_patch`) apply like ours.

The files are written here the way those branches write them: plain safetensors, `{name}.idx` +
`{name}.val`, and the `PatchMetadata` keys in the header.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load, load_file, save, save_file

import delta
from delta import DeltaFormatError

from ._states import clone, states_equal


def patch_metadata(encoding: str, changed: int, total: int, sparse: bool = True) -> dict[str, str]:
    return {"format": "sparse_weight_patch", "version": "1", "sparse": str(sparse), "model_version": "7",
            "num_changed_params": "2", "total_changed_elements": str(changed), "total_elements": str(total),
            "sparsity": str(1 - changed / total), "encoding": encoding}


def pair() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    old = {"a.weight": (torch.randn(300, 400, generator=g) * 0.02).bfloat16(),
           "b.weight": (torch.randn(70_000, generator=g) * 0.02).bfloat16()}
    new = {k: (v.float() + 2e-4 * torch.randn(v.shape, generator=g)).bfloat16() for k, v in old.items()}
    new["b.weight"][5] = old["b.weight"][5] + 1  # and one far jump, so a gap_delta gap needs 32 bits
    new["b.weight"][6:69_000] = old["b.weight"][6:69_000]
    return old, new


def write_patch(old: dict, new: dict, encoding: str) -> bytes:
    tensors, changed = {}, 0
    for name in old:
        idx = torch.nonzero(old[name].reshape(-1).view(torch.int16) != new[name].reshape(-1).view(torch.int16))[:, 0]
        changed += idx.numel()
        tensors[f"{name}.val"] = new[name].reshape(-1)[idx].contiguous()
        if encoding == "raw":
            tensors[f"{name}.idx"] = idx.to(torch.int32)
        else:
            gaps = idx - torch.cat([idx.new_full((1,), -1), idx[:-1]]) - 1
            tensors[f"{name}.idx"] = gaps.to(torch.uint16 if int(gaps.max()) <= 0xFFFF else torch.uint32)
    total = sum(t.numel() for t in old.values())
    return save(tensors, metadata=patch_metadata(encoding, changed, total))


@pytest.mark.parametrize("encoding", ["raw", "gap_delta"])
def test_sparse_weight_patch_applies_bit_exact(encoding):
    old, new = pair()
    data = write_patch(old, new, encoding)
    if encoding == "gap_delta":
        assert {str(t.dtype) for t in delta.read_delta(data)[1].values()} >= {"torch.int64"}
    state = clone(old)
    result = delta.apply(state, data)
    assert states_equal(state, new)
    assert result.header.foreign and result.header.version == 7
    assert result.digest.hexdigest == delta.state_digest(new).hexdigest


def test_sparse_weight_patch_applies_from_the_command_line(tmp_path):
    old, new = pair()
    save_file(old, str(tmp_path / "old.safetensors"))
    (tmp_path / "v7.safetensors").write_bytes(write_patch(old, new, "gap_delta"))
    out = subprocess.run([sys.executable, "-m", "delta", "apply", str(tmp_path / "old.safetensors"),
                          str(tmp_path / "v7.safetensors"), "-o", str(tmp_path / "new.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert states_equal(load_file(str(tmp_path / "new.safetensors")), new)


@pytest.mark.parametrize("change, message", [
    ({"encoding": "nvcomp_cascaded"}, "need nvCOMP on a GPU to decode; publish with encoding 'gap_delta' or 'raw'"),
    ({"sparse": "False"}, r"full snapshot \(sparse=False\), not a delta: load it as a state"),
    ({"version": "2"}, "sparse_weight_patch version '2' is not supported"),
    ({"encoding": "zstd"}, "unknown sparse_weight_patch encoding 'zstd'"),
])
def test_patches_this_reader_cannot_use_are_refused_with_what_to_do(change, message):
    old, new = pair()
    tensors = {k: v for k, v in load(write_patch(old, new, "raw")).items()}
    meta = {**patch_metadata("raw", 1, 1), **change}
    state = clone(old)
    with pytest.raises(DeltaFormatError, match=message):
        delta.apply(state, save(tensors, metadata=meta))
    assert states_equal(state, old)


def test_malformed_patches_are_refused_and_the_state_untouched():
    old, new = pair()
    good = load(write_patch(old, new, "raw"))
    for tensors, message in [
        ({"a.weight.idx": good["a.weight.idx"]}, "needs exactly"),
        ({**good, "a.weight.idx": good["a.weight.idx"][:-1]}, "must be 1-D and of one length"),
        ({**good, "a.weight.idx": good["a.weight.idx"].to(torch.int64)}, "stores int32 positions"),
        ({**good, "a.weight.idx": torch.full_like(good["a.weight.idx"], 10**8)}, "not strictly increasing|out of range"),
    ]:
        state = clone(old)
        with pytest.raises(DeltaFormatError, match=message):
            delta.apply(state, save(tensors, metadata=patch_metadata("raw", 1, 1)))
        assert states_equal(state, old)
