"""Encode -> decode -> apply is bit exact for every codec, dtype and change pattern."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import delta
from delta.tensors.bits import DTYPE_NAMES

from ._states import ALL_DTYPES, FLOAT_DTYPES, adam_like, clone, from_bits, states_equal

CODECS = sorted(delta.CODECS)

# Bit patterns that break value-based comparisons: +-0, +-inf, NaNs with payloads, subnormals.
def _specials(width: int) -> list[int]:
    top = 1 << (width - 1)
    return [0, top, 1, top | 1, (1 << width) - 1, top - 1, 2, top | 2, (1 << (width - 1)) - 2]


@st.composite
def state_pairs(draw):
    """Two states with the same layout: random bits, specials, any density from empty to full."""
    old, new = {}, {}
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(ALL_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=2)))
        n = int(np.prod(shape)) if shape else 1
        width = torch.empty((), dtype=dtype).element_size() * 8
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        pool = np.array(_specials(width), dtype=np.uint64)
        old_bits = rng.integers(0, 2**width, n, dtype=np.uint64, endpoint=False) if width < 64 else rng.integers(
            0, 2**63, n, dtype=np.uint64) * 2
        use_special = rng.random(n) < draw(st.floats(0, 1))
        old_bits[use_special] = rng.choice(pool, use_special.sum())
        density = draw(st.sampled_from([0.0, 0.01, 0.3, 0.7, 1.0]))
        mode = draw(st.sampled_from(["ulp", "random", "special"]))
        changed = rng.random(n) < density
        if mode == "ulp":
            step = rng.choice(np.array([1, 2, 2**width - 1, 2**width - 2], dtype=np.uint64), n)
            new_bits = (old_bits + step) % np.uint64(2**width) if width < 64 else old_bits + step
        elif mode == "random":
            new_bits = rng.integers(0, 2**min(width, 63), n, dtype=np.uint64)
        else:
            new_bits = rng.choice(pool, n)
        new_bits = np.where(changed, new_bits, old_bits)
        if dtype == torch.bool:
            old_bits, new_bits = old_bits & 1, new_bits & 1
        name = f"t{i}.{DTYPE_NAMES[dtype]}"
        old[name] = from_bits(old_bits, dtype, shape)
        new[name] = from_bits(new_bits, dtype, shape)
    return old, new


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=state_pairs())
def test_round_trip_is_bit_exact(codec, pair):
    old, new = pair
    data = delta.diff(old, new, codec=codec, version=7, base_version=6)
    state = clone(old)
    result = delta.apply(state, data)
    assert states_equal(state, new)
    assert result.digest.hexdigest == delta.state_digest(new).hexdigest
    assert states_equal(old, pair[0])  # diff never modifies its inputs


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_every_float_dtype_with_adam_like_steps(codec, dtype):
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(20_000, generator=g) * 0.02)
    old = {"w": base.to(dtype)}
    new = {"w": (base - 1e-3 * torch.sign(torch.randn(20_000, generator=g))).to(dtype)}
    state = clone(old)
    delta.apply(state, delta.diff(old, new, codec=codec))
    assert states_equal(state, new)


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=state_pairs(), chunk=st.sampled_from([1, 2, 7, 64]), workers=st.sampled_from([1, 3]))
def test_round_trip_is_bit_exact_across_chunks_and_threads(codec, pair, chunk, workers):
    """Tiny chunks put chunk edges everywhere; the reader takes the chunk size from the file."""
    old, new = pair
    data = delta.diff(old, new, codec=codec, chunk=chunk, workers=workers)
    assert data == delta.diff(old, new, codec=codec, chunk=chunk, workers=1)
    state = clone(old)
    delta.apply(state, data, workers=workers)
    assert states_equal(state, new)


@pytest.mark.parametrize("codec", CODECS)
def test_chunk_size_out_of_range_is_refused(codec):
    old, new = adam_like()
    with pytest.raises(ValueError, match=r"chunk must be in \[1, 67108864\] elements, got 0"):
        delta.diff(old, new, codec=codec, chunk=0)


@pytest.mark.parametrize("codec", CODECS)
def test_one_worker_runs_every_host_thread_of_a_diff_and_an_apply_on_the_caller(codec, monkeypatch):
    """`workers=1`: the scan, the coding, the decoding and the whole-state hashes (no digest given) start no
    helper thread; an invalid `workers` is refused with the one message every `workers` gets."""
    from delta import _cores

    old, new = adam_like()
    data = delta.diff(old, new, codec=codec)

    def no_helpers(workers: int) -> None:
        raise AssertionError(f"a pool of {workers} helper threads was asked for")

    monkeypatch.setattr(_cores, "_pool", no_helpers)
    assert delta.diff(old, new, codec=codec, workers=1) == data
    state = clone(old)
    delta.apply(state, data, workers=1)
    assert states_equal(state, new)
    delta.state_digest(old, workers=1)
    with pytest.raises(ValueError, match=r"workers must be >= 1 \(or None: one per core\), got 0"):
        delta.diff(old, new, codec=codec, workers=0)
    with pytest.raises(ValueError, match=r"workers must be >= 1 \(or None: one per core\), got 0"):
        delta.apply(clone(old), data, workers=0)


def test_empty_delta_applies_and_changes_nothing():
    old, _ = adam_like()
    data = delta.diff(old, old)
    header, _ = delta.read_delta(data)
    assert header.changed == 0 and header.tensors == ()
    state = clone(old)
    delta.apply(state, data)
    assert states_equal(state, old)


def test_default_codec_is_much_smaller_than_raw_on_adam_steps():
    old, new = adam_like(n=200_000, lr=2e-5)
    raw = len(delta.diff(old, new, codec="raw"))
    ctx = len(delta.diff(old, new))
    header, _ = delta.read_delta(delta.diff(old, new))
    assert 0 < header.density < 0.5
    assert ctx * 5 < raw


def test_same_bytes_whatever_the_dict_order():
    old, new = adam_like()
    reordered_old = dict(reversed(list(old.items())))
    reordered_new = dict(reversed(list(new.items())))
    assert delta.diff(old, new, version=1) == delta.diff(reordered_old, reordered_new, version=1)


def test_same_bytes_from_threads_at_once_and_from_workspaces_kept_or_not():
    """Diffs on two threads at once, each with a workspace of its own; diffs in one workspace, one after the
    other; diffs whose models and words outnumber what a workspace keeps: the bytes of one diff alone."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [adam_like(seed=s, n=100_000) for s in (1, 2)]
    alone = [delta.diff(old, new, version=1) for old, new in pairs]
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            assert list(pool.map(lambda p: delta.diff(*p, version=1, workspace=delta.Workspace()), pairs)) == alone
    for workspace in (delta.Workspace(), delta.Workspace(kept_models=2, kept_words=2)):
        assert [delta.diff(old, new, version=1, workspace=workspace) for old, new in pairs] == alone


def test_nothing_returned_lies_in_the_workspace_the_next_call_reuses():
    """A delta's streams and a decode's changes stay as they were after the next call in the same workspace."""
    codec = delta.codecs.get_codec("ctx")
    workspace = delta.Workspace()
    pairs = [({"w": old["layers.0.w"]}, {"w": new["layers.0.w"]}) for old, new in (adam_like(seed=s) for s in (1, 2))]
    first = codec.encode(*pairs[0], ["w"], workspace=workspace)
    kept = {k: v.clone() for k, v in first.blobs.items()}
    second = codec.encode(*pairs[1], ["w"], workspace=workspace)
    assert any(not torch.equal(kept[k], second.blobs[k]) for k in kept)
    assert all(torch.equal(kept[k], first.blobs[k]) for k in kept)
    decoded = codec.decode(tuple(first.entries), first.blobs, pairs[0][0], workspace=workspace)
    values = decoded[0].values.copy()
    codec.decode(tuple(second.entries), second.blobs, pairs[1][0], workspace=workspace)
    assert np.array_equal(decoded[0].values, values)


def test_a_workspace_serves_one_call_at_a_time():
    workspace = delta.Workspace()
    old, new = adam_like()
    with workspace:  # held, as by a call on another thread
        with pytest.raises(RuntimeError, match="this Workspace is held by another call; give each thread its own"):
            delta.diff(old, new, workspace=workspace)
        with pytest.raises(RuntimeError, match="held by another call"):
            delta.apply(clone(old), delta.diff(old, new), workspace=workspace)
    assert delta.diff(old, new, workspace=workspace) == delta.diff(old, new)


def test_fully_dense_change_costs_about_the_tensor_itself():
    g = torch.Generator().manual_seed(3)
    old = {"w": torch.randn(10_000, generator=g).bfloat16()}
    new = {"w": torch.randn(10_000, generator=g).bfloat16()}
    data = delta.diff(old, new)
    assert len(data) < 1.1 * 10_000 * 2 + 1024
    state = clone(old)
    delta.apply(state, data)
    assert states_equal(state, new)


def test_large_tensor_spanning_many_chunks():
    old, new = adam_like(n=1_500_000, lr=3e-5)
    for codec in CODECS:
        state = clone(old)
        delta.apply(state, delta.diff(old, new, codec=codec))
        assert states_equal(state, new), codec


def test_the_progress_bar_counts_every_element_once_and_never_backwards(capsys):
    """`bash scripts/demo.sh delta` drew a bar that ran backwards: a thread's span of chunks crossed tensors, and the bar
    moved by the last chunk's end minus the first chunk's start, each counted from its own tensor's start."""
    old = {"a": torch.zeros(5000, dtype=torch.bfloat16), "b": torch.zeros(300, dtype=torch.bfloat16)}
    new = clone(old)
    new["a"][3], new["b"][7] = 1, 1
    delta.diff(old, new, chunk=64, workers=1, progress=True)  # small chunks: spans of many, one across both tensors

    def elements(shown: str) -> float:
        return float(shown[:-1]) * 1000 if shown.endswith("k") else float(shown)

    done = [elements(line.split("|")[2].split("/")[0]) for line in
            capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("diff ctx:")]
    assert done == sorted(done) and done[-1] == 5300, done
