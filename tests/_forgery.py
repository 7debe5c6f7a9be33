"""Files as someone with write access to a bucket makes them: any JSON in the header, consistent forgeries.

`split` / `join` take a safetensors file apart and put it back, with any JSON where safetensors expects
strings or numbers (`Raw` text: deep nesting, numbers in any form), a wrong header length or bytes after
the end. `forge_duplicate` and `forge_reorder` make deltas whose streams decode and whose hashes are
consistent, but whose table lists a tensor twice or out of order.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

import delta
from delta.format import read_header_json


@dataclass
class Raw:
    """JSON text put into the header as it is (deep nesting, numbers in any form)."""

    text: str


@dataclass
class Parts:
    meta: dict | None
    blobs: dict[str, list]  # name -> [safetensors dtype, shape, bytes]
    extra: dict = field(default_factory=dict)  # other top-level header keys
    length_delta: int = 0  # added to the 8-byte header length
    tail: bytes = b""


def split(data: bytes) -> Parts:
    header = read_header_json(data)
    start = 8 + struct.unpack("<Q", data[:8])[0]
    meta = header.pop("__metadata__", None)
    blobs = {k: [v["dtype"], v["shape"], data[start + v["data_offsets"][0]:start + v["data_offsets"][1]]]
             for k, v in header.items()}
    return Parts(meta, blobs)


def join(p: Parts) -> bytes:
    header: dict = {}
    if p.meta is not None:
        header["__metadata__"] = p.meta
    chunks, offset = [], 0
    for name, (dtype, shape, raw) in p.blobs.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header.update(p.extra)
    body = dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", max(0, len(body) + p.length_delta)) + body + b"".join(chunks) + p.tail


def dumps(rows: object) -> str:
    """JSON text of a table whose values may hold `Raw` text."""
    raws: list[str] = []

    def put(value):
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {k: put(v) for k, v in value.items()}
        if isinstance(value, list):
            return [put(v) for v in value]
        return value

    text = json.dumps(put(rows), separators=(",", ":"))
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    return text


def deep(k: int, open_: str = "[", close: str = "]") -> str:
    return open_ * k + close * k


def forge_duplicate(old: dict, new: dict, name: str, codec: str, seed: int = 0) -> bytes:
    """A delta from `old` to `new` listing `name` twice, each entry with its own changes, streams and hashes
    consistent: the duplicated-entry bypass (issue 22), made as a forger makes it (encode an alias, rename
    it). The target hash is what a reader that keeps one digest per name would compute."""
    rng = np.random.default_rng(seed)
    other = old[name].clone()
    flat = other.reshape(-1)
    picks = torch.from_numpy(rng.choice(flat.numel(), size=max(1, flat.numel() // 50), replace=False))
    flat[picks] = (flat[picks].float() * 1.01 + 1e-3).to(flat.dtype)
    alias = name + "\x00"
    data = delta.diff({**old, alias: old[name]}, {**new, alias: other}, codec=codec, version=2, base_version=1)
    p = split(data)
    table = json.loads(p.meta["tensors"])
    for e in table:
        if e["name"] == alias:
            e["name"] = name
    p.meta["tensors"] = json.dumps(table, separators=(",", ":"))
    p.meta["total"] = str(sum(t.numel() for t in old.values()))
    p.meta["base_hash"] = delta.state_digest(old).hexdigest
    p.meta["target_hash"] = delta.state_digest({**new, name: other}).hexdigest  # what the proof computes
    for kind in ("indices", "values"):  # raw: the alias's blobs cannot share the name; both entries read one
        p.blobs.pop(f"{alias}.{kind}", None)
    return join(p)


def forge_reorder(old: dict, new: dict, codec: str) -> bytes:
    """A delta from `old` to `new` whose table is not sorted by name, streams in the same order (so they decode)."""
    names = sorted(old)
    alias = {n: f"{len(names) - i:03d}" for i, n in enumerate(names)}  # reverses the order
    data = delta.diff({alias[n]: old[n] for n in names}, {alias[n]: new[n] for n in names}, codec=codec,
                      version=2, base_version=1)
    back = {a: n for n, a in alias.items()}
    p = split(data)
    table = json.loads(p.meta["tensors"])
    for e in table:
        e["name"] = back[e["name"]]
    p.meta["tensors"] = json.dumps(table, separators=(",", ":"))
    p.meta["base_hash"], p.meta["target_hash"] = delta.state_digest(old).hexdigest, delta.state_digest(new).hexdigest
    p.blobs = {(back[k.rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]) if k.rsplit(".", 1)[0] in back else k: v
               for k, v in p.blobs.items()}
    return join(p)
