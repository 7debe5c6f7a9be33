"""Sharded tensors: pieces tile their tensors exactly and are put back together bit for bit; a version
whose pieces do not tile is refused; FSDP2 shards published under torchrun are read back as
`full_tensor()` gathers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file

from delta import Bucket
from delta import DeltaFormatError, Manifest, Subscriber, read_manifest
from delta.bucket.pieces import (Sharded, Slice, assemble, check_layout, flatten, layout_of, piece_views, split,
                                 write_back)

from ._ports import free_port
from ._states import states_equal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@st.composite
def cut_tensors(draw):
    """A random tensor (any float dtype, 1-3 dims, random bits), a dim and random cut points along it."""
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
    info = torch.iinfo(bits)
    seed = draw(st.integers(0, 2**31))
    raw = torch.randint(info.min, info.max, shape, dtype=torch.int64, generator=torch.Generator().manual_seed(seed))
    tensor = raw.to(bits).view(dtype)
    dim = draw(st.integers(0, len(shape) - 1))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, shape[dim] - 1)), max_size=4))) - {shape[dim]})
    return tensor, dim, [0, *cuts, shape[dim]]


def _slices(tensor, dim, bounds):
    return [Slice(tensor.narrow(dim, a, b - a).clone(), tuple(tensor.shape), dim, a)
            for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=200, deadline=None)
@given(cut_tensors(), st.integers(1, 4))
def test_pieces_from_any_ranks_assemble_bit_for_bit(case, world):
    tensor, dim, bounds = case
    parts = _slices(tensor, dim, bounds)
    records, flats, shards = [], {}, []
    for rank in range(world):  # rank r holds every world-th piece (several pieces of one tensor, or none)
        flat, record = {}, {}
        for s in parts[rank::world]:
            f, r = flatten({"w": s})
            flat.update(f)
            record.update(r)
        records.append(record)
        flats.update(flat)
        shards.append(tuple(sorted(flat)))
    layout = layout_of(records)
    check_layout(layout, tuple(shards))
    full = assemble(flats, layout)
    assert states_equal(full, {"w": tensor})
    views = piece_views(full, layout)
    for name in views:  # every piece reads the same bits through the full tensor
        assert torch.equal(views[name].view(torch.uint8), flats[name].contiguous().view(torch.uint8))


@settings(max_examples=200, deadline=None)
@given(cut_tensors(), st.integers(0, 3), st.integers(-2, 2).filter(lambda d: d != 0))
def test_pieces_that_do_not_tile_are_refused(case, which, shift):
    tensor, dim, bounds = case
    pieces = [(f"w@{dim}:{a}", a, b) for a, b in zip(bounds, bounds[1:])]
    i = which % len(pieces)
    name, a, b = pieces[i]
    pieces[i] = (name, a, b + shift)  # a gap, an overlap or a piece past the end
    layout = {"w": Sharded(tuple(tensor.shape), dim, tuple(pieces))}
    with pytest.raises(DeltaFormatError, match="tensor 'w'"):
        check_layout(layout, (tuple(p for p, _, _ in pieces),))


def test_a_piece_on_no_rank_or_on_two_is_refused():
    layout = {"w": Sharded((4, 2), 0, (("w@0:0", 0, 2), ("w@0:2", 2, 4)))}
    check_layout(layout, (("w@0:0",), ("w@0:2",)))
    with pytest.raises(DeltaFormatError, match="held by 0 ranks"):
        check_layout(layout, (("w@0:0",), ()))
    with pytest.raises(DeltaFormatError, match="held by 2 ranks"):
        check_layout(layout, (("w@0:0", "w@0:2"), ("w@0:2",)))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=5), st.integers(1, 5))
def test_split_shares_a_replicated_state_exactly(shapes, world):
    g = torch.Generator().manual_seed(len(shapes))
    state = {f"t{i}": torch.randn(shape, generator=g).bfloat16() for i, shape in enumerate(shapes)}
    records, flats, shards = [], {}, []
    for rank in range(world):
        flat, record = flatten(split(state, rank, world))
        assert not flats.keys() & flat.keys()
        flats.update(flat)
        records.append(record)
        shards.append(tuple(sorted(flat)))
    layout = layout_of(records)
    check_layout(layout, tuple(shards))
    assert states_equal(assemble(flats, layout), state)


def test_write_back_copies_pieces_that_are_not_views():
    full = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    layout = {"w": Sharded((3, 4), 1, (("w@1:0", 0, 1), ("w@1:1", 1, 4)))}
    flat = piece_views(full, layout)
    flat["w@1:1"].fill_(-1)
    write_back(full, flat, layout, {"w@1:1"})
    assert full["w"][:, 1:].eq(-1).all() and full["w"][:, 0].tolist() == [0, 4, 8]


def test_a_manifest_whose_pieces_do_not_tile_is_refused_and_the_previous_one_stays(tmp_path):
    bucket = Bucket.open(tmp_path)
    good = Manifest(1, (), (("w@0:0",), ("w@0:2",)), {"w": Sharded((4, 2), 0, (("w@0:0", 0, 2), ("w@0:2", 2, 4)))})
    bucket.write(good.path, good.to_json())
    body = json.loads(good.to_json())
    body["commit"], body["pieces"]["w"]["slices"][1][1] = 2, 3  # rows 2..3 held by no one
    bucket.write("manifests/0000000002.json", json.dumps(body).encode())
    with pytest.raises(DeltaFormatError, match=r"0000000002.json: tensor 'w': pieces do not tile it along dim 0"):
        Manifest.from_json(json.dumps(body).encode(), path="manifests/0000000002.json")
    assert read_manifest(bucket) == good


def test_fsdp2_shards_published_under_torchrun_read_back_as_full_tensor(tmp_path):
    """Two FSDP2 ranks (gloo, CPU) train the tiny Qwen3 four AdamW steps, each publishing its local
    shards; every version read back equals what `full_tensor()` gathered on the trainer, bit for bit."""
    from models.tiny_qwen3 import build_tiny_qwen3

    model, bucket, out = build_tiny_qwen3(str(tmp_path / "model")), tmp_path / "bucket", tmp_path / "out"
    out.mkdir()
    run = subprocess.run(["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), "-m",
                          "tests._fsdp_child", model, str(bucket), str(out), "4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = read_manifest(Bucket.open(bucket))
    assert [v.version for v in manifest.versions] == [1, 2, 3, 4]
    assert manifest.pieces and all(len(s.pieces) == 2 and s.dim == 0 for s in manifest.pieces.values())
    assert all({f.rank for f in v.files} == {0, 1} for v in manifest.versions)
    assert [v.kind for v in manifest.versions] == ["anchor", "delta", "delta", "anchor"]
    fulls = {v: load_file(str(out / f"full-{v}.safetensors")) for v in range(1, 5)}
    assert not states_equal(fulls[1], fulls[4])
    follower = Subscriber(bucket)
    for version in range(1, 5):  # a reader following version by version (deltas after the first anchor)
        assert follower.sync(version) == version
        assert states_equal(follower.state, fulls[version])
        assert follower.digest.hexdigest == manifest.get(version).state_hash
    given = {k: v.clone() for k, v in fulls[1].items()}  # a reader holding full tensors of version 1
    reader = Subscriber(bucket, given, version=1)
    assert reader.sync(3) == 3 and states_equal(given, fulls[3])
    pulled = tmp_path / "pulled.safetensors"
    cli = subprocess.run([sys.executable, "-m", "delta", "pull", "--bucket", str(bucket), "-o", str(pulled),
                          "--version", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert states_equal(load_file(str(pulled)), fulls[2])
