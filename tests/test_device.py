"""States on a device: the device path (whole-tensor torch work, `delta.codecs._device_scan`) writes exactly the
bytes the compiled host path writes, reads them back to the same state and hash, does not grow its torch
operations or host round trips with a tensor's size or chunks, and the publisher, `apply` and the Subscriber
take device states through it. Run here on CPU tensors (`DELTA_DEVICE_PATH=1`, the `on_device` fixture)."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delta import Bucket
import delta
from delta import read_manifest
from delta.bucket.manifest import version_of_path
from delta.storage import LocalStorage
from delta.tensors import _device
from delta.tensors.hashing import tensor_sums, whole_key
from delta.tensors.bits import DTYPE_NAMES

from ._states import ALL_DTYPES, adam_like, clone, from_bits, states_equal

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Crossings:
    """Counts what crosses between host and device: every copy goes through `_device`'s three functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = Counter()
        self.elements = Counter()
        for name in ("to_host", "to_host_all", "to_device"):
            monkeypatch.setattr(_device, name, self._counted(name, getattr(_device, name)))

    def _counted(self, name, fn):
        def wrapper(x, *args):
            self.calls[name] += 1
            items = x if isinstance(x, (list, tuple)) else [x]
            self.elements[name] += sum(int(np.prod(t.shape)) for t in items)
            return fn(x, *args)
        return wrapper

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture()
def on_device(monkeypatch: pytest.MonkeyPatch) -> Crossings:
    """Every tensor takes the device path (as `DELTA_DEVICE_PATH=1` does), its crossings counted."""
    monkeypatch.setattr(_device, "DEVICE_PATH", True)
    return Crossings(monkeypatch)


def _path(monkeypatch: pytest.MonkeyPatch, device: bool) -> None:
    monkeypatch.setattr(_device, "DEVICE_PATH", device)


# -- the device path against the host path, bit for bit ------------------------------------------------------


@st.composite
def state_pairs(draw) -> tuple[dict, dict, int]:
    """Up to 4 tensors of any supported dtype and size (empty ones included), each with none, a few, many or
    all of its elements changed to random bit patterns; and a chunk size that cuts them unevenly."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    old, new = {}, {}
    for i in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(ALL_DTYPES))
        size = torch.empty((), dtype=dtype).element_size()
        n = draw(st.sampled_from([0, 1, 7, 300, 2049, 5000]))
        raw_old = rng.integers(0, 2 ** (8 * size), n, dtype=np.uint64)
        if dtype.is_floating_point and draw(st.booleans()):  # real weights: a few exponents, small steps
            raw_old = from_bits(raw_old, dtype, (n,)).float().mul_(0).add_(torch.from_numpy(rng.normal(0, 0.02, n)))
            raw_old = raw_old.to(dtype).view(torch.uint8 if size == 1 else {2: torch.int16, 4: torch.int32,
                                                                             8: torch.int64}[size]).numpy()
            raw_old = raw_old.astype(np.uint64) & np.uint64(2 ** (8 * size) - 1)
        density = draw(st.sampled_from([0.0, 0.01, 0.3, 1.0]))
        flip = rng.random(n) < density
        raw_new = raw_old.copy()
        raw_new[flip] ^= rng.integers(1, 2 ** min(8 * size, 12), int(flip.sum()), dtype=np.uint64)
        if dtype == torch.bool:
            raw_old, raw_new = raw_old & 1, raw_old & 1 ^ flip.astype(np.uint64)
        name = f"t{i}.{DTYPE_NAMES[dtype]}"
        old[name], new[name] = from_bits(raw_old, dtype, (n,)), from_bits(raw_new, dtype, (n,))
    return old, new, draw(st.sampled_from([1, 7, 1000, 1 << 20]))


@SETTINGS
@given(pair=state_pairs(), codec=st.sampled_from(sorted(delta.CODECS)), small=st.booleans())
def test_the_device_path_writes_the_host_paths_bytes_and_reads_them_back(pair, codec, small, monkeypatch) -> None:
    """`small`: groups of at most 3000 elements and tensors cut in parts of at most 2048, as a GPU cuts the
    tensors of a large model."""
    old, new, chunk = pair
    monkeypatch.setattr(_device, "GROUP", 3000 if small else 1 << 24)
    monkeypatch.setattr(_device, "SEGMENT", 2048 if small else 1 << 26)
    _path(monkeypatch, False)
    want = delta.diff(old, new, codec=codec, chunk=chunk)
    host_state = clone(old)
    host = delta.apply(host_state, want)
    _path(monkeypatch, True)
    assert delta.diff(old, new, codec=codec, chunk=chunk) == want
    state = clone(old)
    result = delta.apply(state, want)
    assert states_equal(state, new) and states_equal(host_state, new)
    assert result.digest.hexdigest == host.digest.hexdigest == result.header.target_hash


@SETTINGS
@given(pair=state_pairs())
def test_the_state_hash_is_the_same_on_both_paths(pair, monkeypatch) -> None:
    old, _, _ = pair
    _path(monkeypatch, False)
    host = {n: tensor_sums(whole_key(n, t), t) for n, t in old.items()}
    _path(monkeypatch, True)
    assert {n: tensor_sums(whole_key(n, t), t) for n, t in old.items()} == host


def test_a_delta_for_another_state_is_refused_on_the_device_path(on_device: Crossings) -> None:
    old, new = adam_like(seed=2)
    data = delta.diff(old, new)
    other = {k: (v.float() * 3).to(v.dtype) for k, v in old.items()}  # other exponents: ranks beyond their class
    state = clone(other)
    with pytest.raises((delta.DeltaFormatError, delta.StateMismatchError)):
        delta.apply(state, data)
    assert states_equal(state, other)
    # Told the state is `old` (a lying digest), the proof still reads the values really there.
    with pytest.raises((delta.DeltaFormatError, delta.IntegrityError)):
        delta.decode(data, state, digest=delta.state_digest(old))
    assert states_equal(state, other)


# -- bounded work: the same number of torch ops and host round trips for 8x the elements ---------------------


#: Torch operations that only make views (metadata, no kernel).
_VIEWS = {f"aten::{op}" for op in ("as_strided", "slice", "detach", "view", "reshape", "select", "narrow", "unsqueeze",
                                    "flatten", "alias", "_reshape_alias", "expand")}


def _ops(fn) -> Counter:
    """The torch operations `fn` runs, on every thread."""
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config) as prof:
        fn()
    return Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def _one_tensor_pair(n: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(n)
    old = {"w": (torch.randn(n, generator=g) * 0.02).bfloat16(), "b": torch.randn(n // 50, generator=g)}
    new = {k: (v.float() - 1e-4 * torch.sign(torch.randn(v.shape, generator=g))).to(v.dtype) for k, v in old.items()}
    return old, new


@pytest.mark.parametrize("codec", ["ctx", "gap", "raw"])
def test_device_work_does_not_grow_with_elements_or_chunks(codec, monkeypatch) -> None:
    """One diff and one apply of a state, and of the same kind of state 8x larger (8x the chunks): the same
    torch operations, the same number of host round trips."""
    counts = []
    for n in (40_000, 320_000):
        old, new = _one_tensor_pair(n)
        _path(monkeypatch, True)
        crossings = Crossings(monkeypatch)
        digest = delta.state_digest(old)
        before = crossings.total
        out = {}
        _device.POOL.clear()  # both sizes allocate their staging buffers afresh
        diff_ops = _ops(lambda: out.update(data=delta.diff(old, new, codec=codec, old_digest=digest, chunk=4000)))
        diff_trips = crossings.total - before
        state = clone(old)
        before = crossings.total
        _device.POOL.clear()
        apply_ops = _ops(lambda: delta.apply(state, out["data"], digest=digest))
        apply_trips = crossings.total - before
        assert states_equal(state, new)
        counts.append((diff_ops, diff_trips, apply_ops, apply_trips))
        monkeypatch.undo()
    small, large = counts
    assert small == large
    assert sum(small[0].values()) < 1500 and sum(small[2].values()) < 1500  # a few hundred per group of tensors
    assert small[1] <= 4 and small[3] <= 8


def test_the_device_state_hash_takes_a_few_ops_per_group_however_many_tensors(monkeypatch) -> None:
    """The whole-state hash on the device path: 40 or 80 small tensors of one dtype (one group) run the same torch
    operations that compute (views of each tensor aside: they launch nothing), about a hundred (it was ~25 per
    tensor)."""
    _path(monkeypatch, True)
    g = torch.Generator().manual_seed(6)
    counts = []
    for n in (40, 80):
        state = {f"t{i:03d}": torch.randn(300, generator=g).bfloat16() for i in range(n)}
        ops = _ops(lambda: delta.state_digest(state))
        counts.append(Counter({op: k for op, k in ops.items() if op not in _VIEWS}))
    assert counts[0] == counts[1]
    assert sum(counts[0].values()) < 150


def test_staging_buffers_are_reused_across_calls(on_device: Crossings) -> None:
    """The host memory of the copies across comes from `_device.POOL`: a second diff and apply of the same shape
    allocate no buffer (pinned afresh per call, they cost about as much as the copies on a GPU)."""
    old, new = adam_like(seed=4)
    digest = delta.state_digest(old)
    _device.POOL.clear()
    data = delta.diff(old, new, old_digest=digest)
    delta.apply(clone(old), data, digest=digest)
    made = _device.POOL.made
    assert made > 0
    assert delta.diff(old, new, old_digest=digest) == data
    delta.apply(clone(old), data, digest=digest)
    assert _device.POOL.made == made


def test_raw_crosses_once_per_group_however_many_tensors(on_device: Crossings) -> None:
    """`raw` a group at a time: 40 small tensors of one dtype are one group, so one copy to the host on the writer,
    one upload of positions and values and one copy of the hash proofs back on the reader."""
    g = torch.Generator().manual_seed(5)
    old = {f"t{i:02d}": torch.randn(300, generator=g).bfloat16() for i in range(40)}
    new = {k: (v.float() + 0.05 * torch.randn(300, generator=g)).bfloat16() for k, v in old.items()}
    digest = delta.state_digest(old)
    on_device.calls.clear()
    data = delta.diff(old, new, codec="raw", old_digest=digest)
    assert dict(on_device.calls) == {"to_host_all": 1}
    state = clone(old)
    on_device.calls.clear()
    result = delta.apply(state, data, digest=digest)
    assert dict(on_device.calls) == {"to_device": 1, "to_host_all": 1}
    on_device.calls.clear()
    assert states_equal(state, new) and result.digest.hexdigest == delta.state_digest(new).hexdigest
    assert dict(on_device.calls) == {"to_host_all": 1}  # the whole state's hash: one wait for every tensor


# -- device states through apply, the publisher and the Subscriber ------------------------------------------


def test_apply_writes_a_device_state_where_it_lives(on_device: Crossings) -> None:
    old, new = adam_like(seed=3)
    data = delta.diff(old, new)
    state = clone(old)
    kept = {k: v.data_ptr() for k, v in state.items()}
    digest = delta.state_digest(old)
    on_device.elements.clear()
    result = delta.apply(state, data, digest=digest)
    crossed = dict(on_device.elements)
    assert states_equal(state, new) and result.digest.hexdigest == delta.state_digest(new).hexdigest
    assert {k: v.data_ptr() for k, v in state.items()} == kept  # in place
    assert crossed.get("to_host", 0) == 0  # nothing of the state is copied to the host
    assert crossed["to_host_all"] == 5 * len(result.header.tensors)  # per changed tensor: a flag and four sums
    # Class, rank and step of each change go up (in their own widths: 2 + 4 + 2 bytes here), and the number and
    # changes of each chunk with changes (one chunk per tensor here).
    assert crossed["to_device"] == 3 * result.header.changed + 2 * len(result.header.tensors)


def test_a_failed_apply_on_a_device_state_is_rolled_back_there(on_device: Crossings) -> None:
    from delta import Rollback, decode, write_changes

    old, mid = adam_like(seed=4)
    new = {k: (v.float() * 1.01).to(v.dtype) for k, v in mid.items()}
    first, second = delta.diff(old, mid), delta.diff(mid, new)
    state, rollback = clone(old), Rollback()
    header, changes, digest = decode(first, state)
    write_changes(header, changes, state, digest, rollback)
    assert states_equal(state, mid)
    header, changes, digest = decode(second, state)
    changes[0].sums = (1, 2)  # a proof that does not hold: the write must be undone, the first file's too
    with pytest.raises(delta.IntegrityError):
        write_changes(header, changes, state, digest, rollback)
    assert states_equal(state, old)


def test_subscriber_follows_a_bucket_into_a_device_state(tmp_path, on_device: Crossings) -> None:
    old, new = adam_like(seed=5)
    with delta.Publisher(str(tmp_path)) as pub:
        pub.publish(old)
        pub.flush()
        state = clone(old)
        reader = delta.Subscriber(str(tmp_path), state, version=1)
        pub.publish(new)
    assert reader.sync() == 2 and reader.state is state and states_equal(state, new)


def test_publisher_copies_only_changed_elements_of_a_device_state_to_the_host(tmp_path, on_device: Crossings) -> None:
    states = _sparse_steps(4)
    numel = sum(t.numel() for t in states[0].values())
    per_version = []
    with delta.Publisher(str(tmp_path), delta.PublisherConfig(anchor_every=3)) as pub:
        for s in states:
            before = on_device.elements["to_host_all"] + on_device.elements["to_host"]
            pub.publish(s)
            pub.flush()
            per_version.append(on_device.elements["to_host_all"] + on_device.elements["to_host"] - before)
    storage = Bucket.open(str(tmp_path))
    manifest = read_manifest(storage)
    changed = [delta.read_delta(storage.read(v.delta[0].path))[0].changed for v in manifest.versions[1:]]
    assert 0 < min(changed) and max(changed) < numel // 20
    for crossed, c, v in zip(per_version[1:], changed, manifest.versions[1:]):
        if v.kind == "delta":  # per change: class, gap, step, chunk; per tensor: four sums
            assert crossed <= 4 * c + 4 * len(states[0])
    for v, s in zip(manifest.versions, states):
        assert v.state_hash == delta.state_digest(s).hexdigest  # hashed right, from the changes alone
    reader = delta.Subscriber(str(tmp_path))
    assert reader.sync() == 5 and states_equal(reader.state, states[-1])  # anchor of version 3 from the device


def _sparse_steps(count: int) -> list[dict[str, torch.Tensor]]:
    """A bf16/fp32 state and `count` steps that each move ~1 % of its elements (one tensor stays put)."""
    g = torch.Generator().manual_seed(7)
    states = [{"a": torch.randn(300, 100, generator=g).bfloat16(), "b": torch.randn(5000, generator=g),
               "still": torch.randn(64, generator=g).bfloat16()}]
    for _ in range(count):
        new = {k: v.clone() for k, v in states[-1].items()}
        for name in ("a", "b"):
            flat = new[name].view(-1)
            picked = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 100]
            flat[picked] = (flat[picked].float() * 1.01 + 1e-3).to(flat.dtype)
        states.append(new)
    return states


class _Held(LocalStorage):  # a local bucket whose writes wait until released
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.release = threading.Event()
        self.writing = threading.Event()

    def _write(self, path: str, data: bytes) -> None:
        self.writing.set()
        self.release.wait(60)
        super()._write(path, data)


def test_publisher_keeps_at_most_three_copies_of_the_state(tmp_path) -> None:
    shape = (7, 1231)  # found among the live tensors by this shape
    states = [{"w": torch.full(shape, float(i), dtype=torch.bfloat16)} for i in range(8)]
    storage = _Held(str(tmp_path))
    pub = delta.Publisher(storage)
    try:
        storage.release.set()
        pub.publish(states[0])
        pub.flush()
        storage.release.clear()
        storage.writing.clear()
        pub.publish(states[1])
        assert storage.writing.wait(30)  # version 2 is uploading (blocked): every later one waits
        for s in states[2:]:
            pub.publish(s)
        gc.collect()
        mine = {s["w"].data_ptr() for s in states}
        held = {o.untyped_storage().data_ptr() for o in gc.get_objects()
                if issubclass(type(o), torch.Tensor) and tuple(o.shape) == shape} - mine
        assert len(held) <= 3  # published (the diff's base), publishing, waiting
        storage.release.set()
        assert pub.flush(60)
    finally:
        storage.release.set()
        pub.close()
    assert delta.Subscriber(storage).sync() == pub.last.version


class _DownOnce(LocalStorage):  # a local bucket unreachable for the first delta of version 3
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.failed = threading.Event()

    def write_many(self, files):  # every write of a `delta.Bucket` comes here
        path = next(iter(files))
        if not self.failed.is_set() and version_of_path(path) == 3:
            self.failed.set()
            raise delta.errors.BucketUnreachableError("down for a moment", url=self.url, path=path)
        return super().write_many(files)


def test_a_device_state_retried_with_a_newer_one_hashes_what_it_publishes(tmp_path, on_device: Crossings) -> None:
    states = _sparse_steps(2)
    newer = {k: v.clone() for k, v in states[2].items()}
    newer["a"][:10] = states[1]["a"][:10]  # some of version 3's changes undone again
    storage = _DownOnce(str(tmp_path))
    with delta.Publisher(storage, delta.PublisherConfig(retry_delay=0.5, max_retry_delay=0.5)) as pub:
        for s in states[:2]:
            pub.publish(s)
            pub.flush()
        pub.publish(states[2])
        assert storage.failed.wait(30)
        pub.publish(newer)  # waits while version 3 is retried, then is published instead of it
        assert pub.flush(30)
    manifest = read_manifest(storage)
    assert [v.state_hash for v in manifest.versions] == [delta.state_digest(s).hexdigest
                                                         for s in (*states[:2], newer)]
    reader = delta.Subscriber(storage)
    assert reader.sync() == 3 and states_equal(reader.state, newer)


def test_publish_blocks_until_the_device_copy_is_done_and_says_how_long(tmp_path, monkeypatch) -> None:
    from trainer_space.publishing import PublishCallback

    waited = []

    def slow_device(tensors) -> None:  # a GPU finishing the asynchronous copy 0.2 s after its launch
        waited.append(len(list(tensors)))
        time.sleep(0.2)

    monkeypatch.setattr(_device, "synchronize", slow_device)
    old, new = adam_like(seed=6)
    with delta.Publisher(str(tmp_path)) as pub:
        callback = PublishCallback(pub, clone(new), version=0)
        callback.on_step_end(None, None, None)
        assert waited == [len(new)] and pub.copy_s >= 0.2 and callback.copy_s >= pub.copy_s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_state_diffs_to_the_same_bytes_and_applies_on_the_device() -> None:
    old, new = adam_like()
    data = delta.diff(old, new)
    assert delta.diff({k: v.cuda() for k, v in old.items()}, {k: v.cuda() for k, v in new.items()}) == data
    state = {k: v.cuda() for k, v in old.items()}
    result = delta.apply(state, data)
    assert states_equal({k: v.cpu() for k, v in state.items()}, new)
    assert result.digest.hexdigest == delta.state_digest(new).hexdigest
