"""Bad input is rejected with a clear error and the state stays exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save

from delta import DeltaError, DeltaFormatError, IntegrityError, StateMismatchError
import delta

from ._states import adam_like, clone, states_equal


@pytest.fixture(scope="module")
def pair():
    return adam_like(n=20_000, lr=5e-5)


@pytest.mark.parametrize("codec", sorted(delta.CODECS))
def test_truncated_files_are_rejected_and_state_untouched(pair, codec):
    old, new = pair
    data = delta.diff(old, new, codec=codec)
    for cut in sorted({0, 4, 8, 20, len(data) // 3, len(data) // 2, len(data) - 1}):
        state = clone(old)
        with pytest.raises(DeltaFormatError):
            delta.apply(state, data[:cut])
        assert states_equal(state, old)


@pytest.mark.parametrize("codec", sorted(delta.CODECS))
def test_bit_flips_never_apply_wrong_data(pair, codec):
    old, new = pair
    data = delta.diff(old, new, codec=codec)
    rng = np.random.default_rng(0)
    for offset in rng.integers(0, len(data), 60):
        corrupt = bytearray(data)
        corrupt[offset] ^= 1 << int(rng.integers(0, 8))
        state = clone(old)
        try:
            delta.apply(state, bytes(corrupt))
        except DeltaError:
            assert states_equal(state, old), f"state modified by a rejected file (flip at {offset})"
        else:
            assert states_equal(state, new), f"flip at {offset} applied wrong data"


def test_wrong_base_is_rejected(pair):
    old, new = pair
    data = delta.diff(old, new, version=2, base_version=1)
    state = clone(new)
    with pytest.raises(StateMismatchError, match=r"this delta applies to sum128:\w+ \(version 1\)"):
        delta.apply(state, data)
    assert states_equal(state, new)


def test_missing_tensor_wrong_dtype_and_shape_are_named(pair):
    old, new = pair
    data = delta.diff(old, new)
    state = clone(old)
    del state["layers.0.w"]
    with pytest.raises(StateMismatchError, match="tensor 'layers.0.w': is in the delta but not in the state"):
        delta.apply(state, data)
    state = clone(old)
    state["head.fp32"] = state["head.fp32"].double()
    with pytest.raises(StateMismatchError, match="tensor 'head.fp32': the delta holds float32, the state torch.float64"):
        delta.apply(state, data)
    state = clone(old)
    state["layers.0.w"] = state["layers.0.w"].reshape(50, -1).contiguous()
    with pytest.raises(StateMismatchError, match=r"tensor 'layers.0.w': the delta's shape is \(400, 50\), the state's \(50, 400\)"):
        delta.apply(state, data)


def test_target_hash_mismatch_is_caught_before_writing(pair):
    old, new = pair
    data = delta.diff(old, new)
    forged = data.replace(delta.state_digest(new).hexdigest.encode(), b"sum128:" + b"0" * 32)
    state = clone(old)
    with pytest.raises(IntegrityError, match="decodes to a state other than the delta's target; nothing was written"):
        delta.apply(state, forged)
    assert states_equal(state, old)


def test_other_format_version_is_refused_with_upgrade_hint(pair):
    old, new = pair
    data = delta.diff(old, new).replace(b'"format_version":"3"', b'"format_version":"9"')
    with pytest.raises(DeltaFormatError, match=r"format version '9' is not supported .*upgrade the `delta` package"):
        delta.apply(clone(old), data)


def test_plain_safetensors_model_file_is_not_a_delta(pair):
    old, _ = pair
    with pytest.raises(DeltaFormatError, match="not a delta file"):
        delta.apply(clone(old), save(old))


def test_trl_layout_file_from_other_software_applies(pair):
    old, new = pair
    tensors = {}
    for name in old:  # built independently of delta: plain torch + safetensors
        changed = torch.nonzero(old[name].reshape(-1) != new[name].reshape(-1)).reshape(-1)
        if changed.numel():
            tensors[f"{name}.indices"] = changed.to(torch.int32)
            tensors[f"{name}.values"] = new[name].reshape(-1)[changed]
    state = clone(old)
    result = delta.apply(state, save(tensors))
    assert result.header.foreign and result.header.codec == "raw"
    assert states_equal(state, new)


def test_trl_layout_with_bad_indices_is_rejected(pair):
    old, new = pair
    name = "head.fp32"
    for indices, message in [
        (torch.tensor([5, 3], dtype=torch.int32), "not strictly increasing"),
        (torch.tensor([3, 1000], dtype=torch.int32), r"out of range \[0, 1000\)"),
    ]:
        file = save({f"{name}.indices": indices, f"{name}.values": torch.zeros(2)})
        state = clone(old)
        with pytest.raises(DeltaFormatError, match=message):
            delta.apply(state, file)
        assert states_equal(state, old)
    with pytest.raises(DeltaFormatError, match=r"needs exactly `\{name\}.indices` and `\{name\}.values`"):
        delta.apply(clone(old), save({f"{name}.indices": torch.tensor([1], dtype=torch.int32)}))


def test_write_changes_rolls_back_changes_that_do_not_hash_as_proven(pair):
    old, new = pair
    state = clone(old)
    header, changes, before = delta.decode(delta.diff(old, new), state)
    changes[0].values[:] = changes[0].values[::-1].copy()  # tampered after decode proved the sums
    changes[0].sums = None
    with pytest.raises(IntegrityError, match="the state was restored"):
        delta.write_changes(header, changes, state, before)
    assert states_equal(state, old)


def test_one_rollback_undoes_the_writes_of_several_files():
    """A version made of several ranks' files is all or nothing: when the last file's result does not
    hash as its header says, the earlier files' writes are undone too."""
    from dataclasses import replace

    from delta import Rollback, decode, write_changes

    g = torch.Generator().manual_seed(0)
    old = {"a": torch.randn(64, 32, generator=g).to(torch.bfloat16),
           "b": torch.randn(128, generator=g).to(torch.bfloat16)}
    new = {n: (t.float() * 1.01).to(torch.bfloat16) for n, t in old.items()}
    state = clone(old)
    rollback = Rollback()
    first = decode(delta.diff({"a": old["a"]}, {"a": new["a"]}), {"a": state["a"]})
    header, changes, digest = decode(delta.diff({"b": old["b"]}, {"b": new["b"]}), {"b": state["b"]})
    write_changes(first[0], first[1], {"a": state["a"]}, first[2], rollback)
    assert not torch.equal(state["a"], old["a"])
    with pytest.raises(IntegrityError, match="restored"):
        write_changes(replace(header, target_hash=first[0].target_hash), changes, {"b": state["b"]}, digest, rollback)
    assert states_equal(state, old)
    rollback.restore()  # a second restore changes nothing
    assert states_equal(state, old)
