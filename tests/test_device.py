"""States on a device: the torch chunk scan finds exactly what the compiled CPU scan finds, and the publisher,
`apply` and the Subscriber take GPU-resident states through the same torch code, run here on CPU tensors."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

import delta
from delta.bucket.manifest import read_manifest, version_of_path
from delta.codecs._kernels import scan_chunk
from delta.storage import open_storage
from delta.tensors import _device
from delta.tensors._device import scan_chunk_torch
from delta.tensors.bits import DTYPE_NAMES, bits, layout_of

from ._states import ALL_DTYPES, adam_like, clone, states_equal

NARROW = [d for d in ALL_DTYPES if torch.empty((), dtype=d).element_size() <= 4]


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("context", [True, False])
def test_torch_scan_matches_compiled_scan(dtype, context):
    rng = np.random.default_rng(5)
    size = torch.empty((), dtype=dtype).element_size()
    raw_old = rng.integers(0, 2 ** (8 * size), 300_000, dtype=np.uint64).astype(f"u{size}")
    raw_new = raw_old.copy()
    flip = rng.random(raw_old.size) < 0.05
    raw_new[flip] = rng.integers(0, 2 ** (8 * size), int(flip.sum()), dtype=np.uint64).astype(f"u{size}")
    if dtype == torch.bool:
        raw_old, raw_new = raw_old & 1, raw_new & 1
    old = torch.from_numpy(raw_old.view(f"i{size}") if size > 1 else raw_old)
    new = torch.from_numpy(raw_new.view(f"i{size}") if size > 1 else raw_new)
    old = (old != 0) if dtype == torch.bool else old.view(dtype)
    new = (new != 0) if dtype == torch.bool else new.view(dtype)
    layout = layout_of(dtype)
    shift, mask = (layout.shift, layout.mask) if context else (0, 0)
    a, b = bits(old), bits(new)
    for lo, hi in [(0, 1000), (1000, 131_072), (131_072, a.size)]:
        cls, gaps, steps = np.empty(hi - lo, np.uint16), np.empty(hi - lo, np.uint32), np.empty(hi - lo, np.uint64)
        m, cmin, cmax = scan_chunk(a, b, lo, hi, a.dtype.type(shift), a.dtype.type(mask), cls, gaps, steps)
        got = scan_chunk_torch(old[lo:hi], new[lo:hi], shift, mask)
        assert got[:3] == (m, cmin, cmax)
        for want, have in zip((cls[:m], gaps[:m], steps[:m]), got[3:]):
            assert np.array_equal(have, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_state_diffs_to_the_same_bytes():
    old, new = adam_like()
    on_device = delta.diff({k: v.cuda() for k, v in old.items()}, {k: v.cuda() for k, v in new.items()})
    assert on_device == delta.diff(old, new)


# -- states on a device: the same torch code, run on CPU tensors through `_device`'s seam ---------------


class HostCopies:
    """Counts what crosses to the host: every device-to-host copy goes through `_device.to_host`."""

    def __init__(self) -> None:
        self.elements = 0
        self.calls = 0
        self._to_host = _device.to_host

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.elements += t.numel()
        return self._to_host(t)


@pytest.fixture()
def on_device(monkeypatch: pytest.MonkeyPatch) -> HostCopies:
    """Every tensor is treated as living on a device (a GPU): the device path runs on CPU tensors."""
    copies = HostCopies()
    monkeypatch.setattr(_device, "on_host", lambda t: False)
    monkeypatch.setattr(_device, "to_host", copies)
    return copies


def test_apply_writes_a_device_state_where_it_lives(on_device: HostCopies) -> None:
    old, new = adam_like(seed=3)
    data = delta.diff(old, new)
    state = clone(old)
    kept = {k: v.data_ptr() for k, v in state.items()}
    result = delta.apply(state, data)
    assert states_equal(state, new) and result.digest.hexdigest == delta.state_digest(new).hexdigest
    assert {k: v.data_ptr() for k, v in state.items()} == kept  # in place
    assert on_device.elements == sum(old[e.name].numel() for e in result.header.tensors)  # decoded on the host


def test_a_failed_apply_on_a_device_state_is_rolled_back_there(on_device: HostCopies) -> None:
    from delta import Rollback, decode, write_changes

    old, mid = adam_like(seed=4)
    new = {k: (v.float() * 1.01).to(v.dtype) for k, v in mid.items()}
    first, second = delta.diff(old, mid), delta.diff(mid, new)
    state, rollback = clone(old), Rollback()
    header, changes, digest = decode(first, state)
    write_changes(header, changes, state, digest, rollback)
    assert states_equal(state, mid)
    header, changes, digest = decode(second, state)
    changes[0].digest = "0" * 32  # a proof that does not hold: the write must be undone, the first file's too
    with pytest.raises(delta.IntegrityError):
        write_changes(header, changes, state, digest, rollback)
    assert states_equal(state, old)


def test_subscriber_follows_a_bucket_into_a_device_state(tmp_path, on_device: HostCopies) -> None:
    old, new = adam_like(seed=5)
    with delta.Publisher(str(tmp_path)) as pub:
        pub.publish(old)
        pub.flush()
        state = clone(old)
        reader = delta.Subscriber(str(tmp_path), state, version=1)
        pub.publish(new)
    assert reader.sync() == 2 and reader.state is state and states_equal(state, new)


def test_publisher_copies_only_changed_elements_of_a_device_state_to_the_host(tmp_path, on_device: HostCopies) -> None:
    states = _sparse_steps(4)
    numel = sum(t.numel() for t in states[0].values())
    per_version = []
    with delta.Publisher(str(tmp_path), delta.PublisherConfig(anchor_every=3)) as pub:
        for s in states:
            before = on_device.elements
            pub.publish(s)
            pub.flush()
            per_version.append(on_device.elements - before)
    manifest = read_manifest(open_storage(str(tmp_path)))
    changed = [delta.read_delta(open_storage(str(tmp_path)).read(v.delta[0].path))[0].changed
               for v in manifest.versions[1:]]
    assert per_version[0] == numel  # the first version: the host copy the later ones follow
    assert per_version[1:] == [2 * c for c in changed]  # then positions and values of changed elements only
    assert 0 < min(changed) and max(changed) < numel // 20
    for v, s in zip(manifest.versions, states):
        assert v.state_hash == delta.state_digest(s).hexdigest  # hashed right from the host copy
    reader = delta.Subscriber(str(tmp_path))
    assert reader.sync() == 5 and states_equal(reader.state, states[-1])  # anchor of version 3 from the host copy too


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


class _Held(open_storage(".").__class__):  # a local bucket whose writes wait until released
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


class _DownOnce(open_storage(".").__class__):  # a local bucket unreachable for the first delta of version 3
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.failed = threading.Event()

    def write(self, path: str, data: bytes) -> None:
        if not self.failed.is_set() and version_of_path(path) == 3:
            self.failed.set()
            raise delta.BucketUnreachableError("down for a moment", url=self.url, path=path)
        super().write(path, data)


def test_a_device_state_retried_with_a_newer_one_hashes_what_it_publishes(tmp_path, on_device: HostCopies) -> None:
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
