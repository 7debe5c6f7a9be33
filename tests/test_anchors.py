"""Anchors: bounded shards, bit-exact round trip, incomplete anchors refused."""

from __future__ import annotations

import pytest

from delta import DeltaFormatError
from delta.bucket.anchors import decode_anchor, encode_anchor, shard_names

from ._states import states_equal
from ._trainer import initial_state


def test_shards_are_bounded_and_round_trip():
    state = initial_state(20_000)
    shards = encode_anchor(state, version=3, state_hash="sum128:x", max_shard_bytes=25_000)
    assert shard_names(state, 25_000) == [["head.fp32", "layers.0.w"], ["layers.1.w"]]
    assert len(shards) == 2 and all(len(s) < 25_000 + 1000 for s in shards)
    assert states_equal(decode_anchor(shards, version=3), state)
    assert encode_anchor(state, version=3, state_hash="sum128:x", max_shard_bytes=25_000) == shards


def test_incomplete_or_mixed_anchors_are_refused():
    state = initial_state(20_000)
    shards = encode_anchor(state, version=3, state_hash="sum128:x", max_shard_bytes=25_000)
    with pytest.raises(DeltaFormatError, match="incomplete anchor"):
        decode_anchor(shards[:1])
    other = encode_anchor(state, version=4, state_hash="sum128:y", max_shard_bytes=25_000)
    with pytest.raises(DeltaFormatError, match="another anchor"):
        decode_anchor([shards[0], other[1]])
    with pytest.raises(DeltaFormatError, match="expected 5"):
        decode_anchor(shards, version=5)
