"""trainer_space.payload: the raw layout's size from a header equals what codec raw really writes."""

from __future__ import annotations

import struct

import delta
from trainer_space.payload import dense_bytes, raw_bytes

from ._dashboard_states import changed_copy, header_of, qwen3_state


def test_raw_bytes_match_a_real_raw_file_and_dense_is_the_state() -> None:
    old = qwen3_state()
    new = changed_copy(old, {"model.layers.0.mlp.gate_proj.weight": 100, "lm_head.weight": 7})
    new["model.norm.weight"] = new["model.norm.weight"].float()  # another width
    old["model.norm.weight"] = old["model.norm.weight"].float()
    new["model.norm.weight"][:3] += 1
    raw_file = delta.diff(old, new, codec="raw")
    (json_len,) = struct.unpack("<Q", raw_file[:8])

    header = header_of(old, new)  # the default codec's header says the same changes
    assert raw_bytes(header) == len(raw_file) - 8 - json_len == 100 * 6 + 7 * 6 + 3 * 8
    assert dense_bytes(new) == sum(t.numel() for t in new.values()) * 2 + 8 * 2
