"""The state hash (`sum128`): the documented formula, kept up to date from changes alone on both paths, the
same for a tensor whole or cut into pieces along any dimension, and records read back range-checked."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import delta
from delta.errors import DeltaFormatError
from delta.tensors import _device
from delta.tensors._sumhash import TensorKey
from delta.tensors.hashing import StateDigest, change_sums, state_digest, tensor_sums, whole_key

from ._states import ALL_DTYPES, bit_equal, from_bits
from .make_golden import HERE, golden_states

M = (1 << 64) - 1


@contextmanager
def device_path(on: bool):
    """The device path on (or off) for the block, as `DELTA_DEVICE_PATH=1` sets it for a process."""
    previous = _device.DEVICE_PATH
    _device.DEVICE_PATH = on
    try:
        yield
    finally:
        _device.DEVICE_PATH = previous


def _spec_hash(state: dict[str, torch.Tensor]) -> str:
    """docs/delta.md, "The state hash", in plain Python integers: an independent reading of the definition."""
    def fmix(x: int) -> int:
        x ^= x >> 33
        x = x * 0xFF51AFD7ED558CCD & M
        x ^= x >> 33
        x = x * 0xC4CEB9FE1A85EC53 & M
        return x ^ (x >> 33)

    h = xxhash.xxh3_128(b"sum128\n")
    for name in sorted(state):
        t = state[name]
        dtype = str(t.dtype).removeprefix("torch.")
        seed = xxhash.xxh3_128_intdigest(f"{name}\0{dtype}\0{tuple(t.shape)}".encode())
        seeds = (seed >> 64, seed & M)
        width = t.element_size()
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy() if t.dtype != torch.bool else \
            t.reshape(-1).to(torch.uint8).numpy()
        values = [int.from_bytes(raw[i * width:(i + 1) * width].tobytes(), "little") for i in range(t.numel())]
        sums = [sum(fmix((((i ^ s) * 0x9E3779B97F4A7C15) & M) ^ v) for i, v in enumerate(values)) & M for s in seeds]
        h.update(f"{name}\0{dtype}\0{list(t.shape)}\0{sums[0]:016x}{sums[1]:016x}\n".encode())
    return "sum128:" + h.hexdigest()


@pytest.mark.parametrize("on_device", [False, True])
def test_the_hash_is_the_documented_formula(on_device, monkeypatch) -> None:
    monkeypatch.setattr(_device, "DEVICE_PATH", on_device)
    old, _ = golden_states()
    small = {k: v.reshape(-1)[:257].clone() for k, v in old.items()} | {"empty": torch.zeros(0, 3)}
    assert state_digest(small).hexdigest == _spec_hash(small)
    assert state_digest(small).hexdigest.startswith("sum128:")


def test_the_golden_states_hash_as_they_always_did() -> None:
    """A change to the definition is a change of format: it fails here first."""
    old, new = golden_states()
    assert state_digest(old).hexdigest == "sum128:2483074250fa8c58d90fbd8c125976b6"
    assert state_digest(new).hexdigest == "sum128:09acd7674645bdcb8c566b4426e35210"


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(ALL_DTYPES), n=st.integers(0, 3000), data=st.data(), on_device=st.booleans())
def test_moving_by_the_changes_equals_hashing_again(dtype, n, data, on_device) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    width = torch.empty((), dtype=dtype).element_size() * 8
    old = from_bits(rng.integers(0, 2**width, n, dtype=np.uint64) if width < 64 else
                    rng.integers(0, 2**63, n, dtype=np.uint64), dtype, (n,))
    positions = np.unique(rng.integers(0, max(n, 1), data.draw(st.integers(0, n)))) if n else np.zeros(0, np.int64)
    new = old.clone()
    flips = rng.integers(1, 2**min(width, 16), positions.size, dtype=np.uint64)
    flat = new.view(torch.uint8) if dtype == torch.bool else new
    if dtype == torch.bool:
        flat[torch.from_numpy(positions)] ^= 1
    else:
        ints = flat.view({8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width])
        ints[torch.from_numpy(positions)] ^= torch.from_numpy(flips.astype(np.int64)).to(ints.dtype)
    with device_path(on_device):
        key = whole_key("t", old)
        digest = state_digest({"t": old})
        new_bits = _device.int_view(new)[torch.from_numpy(positions)]
        moved = digest.moved({"t": change_sums(key, old, positions, new_bits.numpy())})
        assert moved == state_digest({"t": new})


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), data=st.data(), on_device=st.booleans())
def test_pieces_along_any_dimension_sum_to_the_whole_tensor(shape, data, on_device) -> None:
    t = torch.randn(shape).bfloat16()
    dim = data.draw(st.integers(0, len(shape) - 1))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, shape[dim] - 1), max_size=3)) if shape[dim] > 1 else []))
    bounds = [0, *cuts, shape[dim]]
    flat, keys = {}, {}
    for a, b in zip(bounds, bounds[1:]):
        piece = f"w@{dim}:{a}"
        flat[piece] = t.narrow(dim, a, b - a).contiguous()
        keys[piece] = TensorKey.piece("w", "bfloat16", tuple(shape), dim, a, b)
    with device_path(on_device):
        assert state_digest(flat, keys).hexdigest == state_digest({"w": t}).hexdigest


def test_a_rank_record_is_read_back_range_checked() -> None:
    digest = state_digest({"w": torch.ones(4, 3)})
    assert StateDigest.from_json(digest.to_json()) == digest
    good = digest.to_json()["w"]
    for bad in (None, [], good[:7], [5, *good[1:]], [good[0], "float99", *good[2:]], [*good[:2], [-1], *good[3:]],
                [*good[:6], 1 << 64, good[7]], [*good[:6], "12", good[7]], [*good[:6], True, good[7]]):
        with pytest.raises(DeltaFormatError, match="malformed"):
            StateDigest.from_json({"w": bad})
    with pytest.raises(DeltaFormatError, match="not an object"):
        StateDigest.from_json([good])


def test_whole_state_sums_on_the_host_use_threads_and_agree(monkeypatch) -> None:
    t = torch.randn(3 * (1 << 22) + 5).bfloat16()  # several host segments
    key = whole_key("big", t)
    threaded = tensor_sums(key, t)
    monkeypatch.setattr(_device, "DEVICE_PATH", True)
    assert tensor_sums(key, t) == threaded


def test_a_file_of_the_retired_hash_scheme_is_refused_with_what_to_do() -> None:
    old, _ = golden_states()
    state = {k: v.clone() for k, v in old.items()}
    with pytest.raises(delta.DeltaFormatError, match=r"format version '2' is not supported by this reader \(supports "
                       r"3\); it was written by an older `delta`: publish an anchor"):
        delta.apply(state, os.path.join(HERE, "golden_v2.ctx.delta"))
    assert all(bit_equal(state[k], old[k]) for k in old)


def test_device_state_sums_by_group_equal_the_host_sums(monkeypatch) -> None:
    """Many small tensors of two dtypes (several groups), a tensor in parts and an empty one: the device path,
    a group at a time, hashes every tensor as the host does."""
    g = torch.Generator().manual_seed(9)
    state = {f"t{i:02d}": torch.randn(37 + i, generator=g).to(torch.bfloat16 if i % 3 else torch.float32)
             for i in range(30)}
    state |= {"big": torch.randn(5000, generator=g).bfloat16(), "empty": torch.zeros(0, 4),
              "flag": torch.rand(65, generator=g) > 0.5}
    host = state_digest(state)
    monkeypatch.setattr(_device, "GROUP", 300)  # groups of a few tensors
    monkeypatch.setattr(_device, "SEGMENT", 1024)  # "big" in five parts
    with device_path(True):
        assert state_digest(state) == host
