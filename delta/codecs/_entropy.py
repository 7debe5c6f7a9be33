"""Entropy stages: how the integer streams of the sparse codecs become bytes.

A stage receives symbols grouped by *context* — (kind, width, class): `gap` or `step`, the tensor's
bit width, the old value's exponent class — in a fixed order, and must give them back in the same
grouping. `ZstdPlanes` merges classes and relies on zstd over byte planes (fast, simple).
`AnsContexts` codes every context with its own adaptive model under rANS (the `constriction`
package), which is what lets the exponent class pay off: within a class, steps are mostly ±1 ULP
and changes are nearly certain or nearly impossible, so each costs close to its true information.

ANS layout (all in one delta): `models` (zstd, uint32) lists per context its key, symbol count,
compressed word count and the exact symbol counts the model is built from; `ans` holds each
context's compressed words; `escapes` (zstd, uint64 planes) holds values too large to symbolise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import constriction
import numpy as np

from ..errors import DeltaFormatError
from ._streams import pack, unpack

Key = tuple[str, int, int]  # (kind: "gap" | "step", width in bits, class)

KINDS = ("gap", "step")
DIRECT = {"gap": 16, "step": 64}  # values below are symbols themselves; above: bucket + raw bits
SUB_BITS = 8  # top bits below the leading one, coded under a model of their own per bucket
MAX_RAW_BITS = 31  # beyond: escaped (the uniform low part stays < 2**24 as constriction requires)
MAX_CONTEXT_SYMBOLS = 2**32 - 1


def _alphabet(direct: int) -> tuple[int, int]:
    """(number of symbols, escape symbol) for a given direct range."""
    escape = direct + (MAX_RAW_BITS + 1 - int(direct).bit_length()) + 1
    return escape + 1, escape


def _bitlen(values: np.ndarray) -> np.ndarray:
    """Exact bit length of each uint64 value (0 for 0)."""
    out = np.zeros(values.shape, np.int64)
    nz = values > 0
    out[nz] = np.floor(np.log2(values[nz].astype(np.float64))).astype(np.int64) + 1
    # float64 rounding can be off by one near powers of two for huge values: correct exactly.
    high = nz & (out < 64) & (values >= (np.uint64(1) << np.minimum(out, 63).astype(np.uint64)))
    out[high] += 1
    low = nz & (out > 1) & (values < (np.uint64(1) << np.maximum(out - 1, 0).astype(np.uint64)))
    out[low] -= 1
    return out


@dataclass
class Symbols:
    """A context's values split for coding.

    main: one symbol per value: the value itself below `direct`, else its bit-length bucket, or escape.
    raw_bits: per bucketed value, the number of bits below its leading one.
    sub: per bucketed value, the top min(SUB_BITS, raw_bits) of them (modelled per bucket).
    low: per bucketed value, the remaining low bits (coded uniformly), `low_bits` of them.
    escaped: values too large for a bucket, stored verbatim.
    """

    main: np.ndarray
    raw_bits: np.ndarray
    sub: np.ndarray
    low: np.ndarray
    low_bits: np.ndarray
    escaped: np.ndarray


def symbolise(values: np.ndarray, direct: int) -> Symbols:
    """Split values into symbols (see `Symbols`)."""
    values = values.astype(np.uint64, copy=False)
    _, escape = _alphabet(direct)
    bitlen = _bitlen(values)
    big = values >= direct
    main = np.where(big, direct + bitlen - int(direct).bit_length(), values.astype(np.int64))
    escaped = big & (bitlen - 1 > MAX_RAW_BITS)
    main[escaped] = escape
    bucketed = big & ~escaped
    raw_bits = bitlen[bucketed] - 1
    rest = values[bucketed] - (np.uint64(1) << raw_bits.astype(np.uint64))
    low_bits = np.maximum(raw_bits - SUB_BITS, 0)
    sub = (rest >> low_bits.astype(np.uint64)).astype(np.int32)
    low = (rest & ((np.uint64(1) << low_bits.astype(np.uint64)) - np.uint64(1))).astype(np.int32)
    return Symbols(main.astype(np.int32), raw_bits, sub, low, low_bits, values[escaped])


def _raw_bits_of(main: np.ndarray, direct: int) -> np.ndarray:
    return main - direct + int(direct).bit_length() - 1


class ZstdPlanes:
    """All classes of a (kind, width) in one zstd frame of byte planes: streams `gap{W}`, `step{W}`."""

    @staticmethod
    def merge(key: Key) -> Key:
        return (key[0], key[1], 0)

    def encode(self, groups: dict[Key, list[np.ndarray]]) -> dict[str, bytes]:
        out = {}
        for (kind, width, _), parts in sorted(groups.items()):
            dtype = np.uint32 if kind == "gap" else np.dtype(f"u{width // 8}")
            out[f"{kind}{width}"] = pack(np.concatenate(parts).astype(dtype, copy=False))
        return out

    def decode(self, blobs: dict[str, bytes], counts: dict[Key, int]) -> dict[Key, np.ndarray]:
        out = {}
        for (kind, width, _), n in sorted(counts.items()):
            dtype = np.uint32 if kind == "gap" else np.dtype(f"u{width // 8}")
            name = f"{kind}{width}"
            if name not in blobs:
                raise DeltaFormatError(f"stream {name!r} is missing")
            out[(kind, width, 0)] = unpack(blobs[name], dtype, n, name)
        return out

    def stream_names(self, counts: Iterable[Key]) -> set[str]:
        return {f"{kind}{width}" for kind, width, _ in counts}


class AnsContexts:
    """Each (kind, width, class) context coded under rANS with its own empirical models.

    Per context, three layers on one ANS stack, decoded in this order: the main symbols; per
    bit-length bucket, the top bits below the leading one (their own model per bucket, which is
    where "the new value is ±lr" or "the gap is about 1/p" shows); the remaining low bits, uniform.
    """

    @staticmethod
    def merge(key: Key) -> Key:
        return key

    def encode(self, groups: dict[Key, list[np.ndarray]]) -> dict[str, bytes]:
        if not groups:
            return {}
        table: list[int] = []
        words: list[np.ndarray] = []
        escapes: list[np.ndarray] = []
        for key in sorted(groups):
            kind, width, cls = key
            values = np.concatenate(groups[key])
            if values.size == 0:
                continue
            if values.size > MAX_CONTEXT_SYMBOLS:
                raise ValueError(f"context {key} has {values.size} symbols, more than one delta can hold")
            direct = DIRECT[kind]
            sym = symbolise(values, direct)
            escapes.append(sym.escaped)
            coder = constriction.stream.stack.AnsCoder()
            uniform = sym.low_bits > 0
            if uniform.any():
                coder.encode_reverse(sym.low[uniform], constriction.stream.model.Uniform(),
                                     (np.int64(1) << sym.low_bits[uniform]).astype(np.int32))
            bucket_of = sym.main[sym.main >= direct]
            bucket_of = bucket_of[bucket_of != _alphabet(direct)[1]]
            sub_tables: list[int] = []
            for bucket in np.unique(bucket_of)[::-1].tolist():  # descending: decoded ascending
                sub = sym.sub[bucket_of == bucket]
                distinct, counts = np.unique(sub, return_counts=True)
                if distinct.size > 1:
                    coder.encode_reverse(sub, _model(distinct, counts))
                sub_tables = [bucket, distinct.size, *_pairs(distinct, counts)] + sub_tables
            distinct, counts = np.unique(sym.main, return_counts=True)
            if distinct.size > 1:  # a single symbol carries no information (and is no valid model)
                coder.encode_reverse(sym.main, _model(distinct, counts))
            compressed = coder.get_compressed()
            words.append(compressed)
            table += [KINDS.index(kind), width, cls, values.size, compressed.size, distinct.size]
            table += _pairs(distinct, counts)
            table += [len(np.unique(bucket_of))] + sub_tables
        return {
            "models": pack(np.asarray(table, np.uint32)),
            "ans": np.concatenate(words).astype("<u4").tobytes(),
            "escapes": pack(np.concatenate(escapes).astype(np.uint64)),
        }

    def decode(self, blobs: dict[str, bytes], counts: dict[Key, int]) -> dict[Key, np.ndarray]:
        for name in ("models", "ans", "escapes"):
            if name not in blobs:
                raise DeltaFormatError(f"stream {name!r} is missing")
        max_rows = sum(8 + 2 * _alphabet(DIRECT[k[0]])[0] * (1 + 2**SUB_BITS) for k in counts)
        table = _Reader(unpack(blobs["models"], np.uint32, None, "models", max_rows).astype(np.int64))
        if len(blobs["ans"]) % 4:
            raise DeltaFormatError("stream 'ans' is not a whole number of 32-bit words")
        ans = np.frombuffer(blobs["ans"], "<u4")
        escapes = unpack(blobs["escapes"], np.uint64, None, "escapes", sum(counts.values()))
        out: dict[Key, np.ndarray] = {}
        word_at = escape_at = 0
        while not table.done():
            kind_i, width, cls, n, n_words, n_distinct = table.take(6).tolist()
            if kind_i >= len(KINDS):
                raise DeltaFormatError("stream 'models' names an unknown kind")
            key = (KINDS[kind_i], width, cls)
            if key in out or n == 0 or counts.get(key) != n:
                raise DeltaFormatError(f"context {key} holds {n} symbols, the class table needs {counts.get(key)}")
            direct = DIRECT[key[0]]
            alphabet, escape = _alphabet(direct)
            main_model = table.pairs(n_distinct, alphabet, n, key)
            subs = {}
            for _ in range(table.take(1)[0]):
                bucket, k = table.take(2).tolist()
                if not direct <= bucket < escape or bucket in subs:
                    raise DeltaFormatError(f"context {key} has a malformed bucket model")
                size = 1 << min(SUB_BITS, int(_raw_bits_of(np.int64(bucket), direct)))
                subs[bucket] = table.pairs(k, size, None, key)
            if word_at + n_words > ans.size:
                raise DeltaFormatError("stream 'ans' ends early")
            coder = constriction.stream.stack.AnsCoder(ans[word_at:word_at + n_words].astype(np.uint32))
            word_at += n_words
            try:
                main = _decode(coder, main_model, n)
                buckets = main[(main >= direct) & (main != escape)]
                if set(np.unique(buckets).tolist()) != set(subs):
                    raise DeltaFormatError(f"context {key}: bucket models do not match the symbols")
                sub = np.zeros(buckets.size, np.int64)
                for bucket in sorted(subs):
                    where = buckets == bucket
                    sub[where] = _decode(coder, subs[bucket], int(where.sum()))
                raw_bits = _raw_bits_of(buckets.astype(np.int64), direct)
                low_bits = np.maximum(raw_bits - SUB_BITS, 0)
                low = np.zeros(buckets.size, np.int64)
                uniform = low_bits > 0
                if uniform.any():
                    low[uniform] = coder.decode(constriction.stream.model.Uniform(),
                                                (np.int64(1) << low_bits[uniform]).astype(np.int32))
            except (ValueError, RuntimeError, AssertionError) as e:
                raise DeltaFormatError(f"context {key} does not decode: {e}") from e
            if not coder.is_empty():
                raise DeltaFormatError(f"context {key} has data left over after decoding")
            values = main.astype(np.uint64)
            is_bucket = (main >= direct) & (main != escape)
            values[is_bucket] = ((np.uint64(1) << raw_bits.astype(np.uint64))
                                 + (sub.astype(np.uint64) << low_bits.astype(np.uint64)) + low.astype(np.uint64))
            n_escaped = int((main == escape).sum())
            if escape_at + n_escaped > escapes.size:
                raise DeltaFormatError("stream 'escapes' ends early")
            values[main == escape] = escapes[escape_at:escape_at + n_escaped]
            escape_at += n_escaped
            out[key] = values
        if word_at != ans.size or escape_at != escapes.size:
            raise DeltaFormatError("streams 'ans' or 'escapes' hold data no context uses")
        missing = set(k for k, n in counts.items() if n) - set(out)
        if missing:
            raise DeltaFormatError(f"contexts {sorted(missing)[:3]} are missing from 'models'")
        return out

    def stream_names(self, counts: Iterable[Key]) -> set[str]:
        return {"models", "ans", "escapes"}


class _Reader:
    """Reads the `models` table, failing clearly when it is short or malformed."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.at = data, 0

    def done(self) -> bool:
        return self.at >= self.data.size

    def take(self, n: int) -> np.ndarray:
        if self.at + n > self.data.size:
            raise DeltaFormatError("stream 'models' ends early")
        self.at += n
        return self.data[self.at - n:self.at]

    def pairs(self, k: int, alphabet: int, total: int | None, key: Key) -> tuple[np.ndarray, np.ndarray]:
        """k (symbol, count) pairs written by `_pairs`, checked: symbols inside the alphabet, counts positive."""
        pairs = self.take(2 * k).reshape(-1, 2)
        distinct, counts = np.cumsum(pairs[:, 0]), pairs[:, 1]
        if ((distinct >= alphabet).any() or (counts <= 0).any() or (np.diff(distinct) <= 0).any()
                or (total is not None and int(counts.sum()) != total)):
            raise DeltaFormatError(f"model of context {key} is malformed")
        return distinct, counts


def _pairs(distinct: np.ndarray, counts: np.ndarray) -> list[int]:
    """(symbol, count) pairs with symbols as differences from the previous one: small numbers for zstd."""
    return np.stack([np.diff(distinct, prepend=0), counts], axis=1).reshape(-1).tolist()


def _decode(coder, model: tuple[np.ndarray, np.ndarray], n: int) -> np.ndarray:
    distinct, counts = model
    if distinct.size == 0:
        if n:
            raise DeltaFormatError("a model with no symbols cannot decode any")
        return np.zeros(0, np.int64)
    if distinct.size == 1:
        return np.full(n, distinct[0], np.int64)
    return coder.decode(_model(distinct, counts), n).astype(np.int64)


def _model(distinct: np.ndarray, counts: np.ndarray):
    """Categorical model over symbols 0..max from exact counts (zero for absent symbols).

    Writer and reader build it from the same integers, so both quantize it identically.
    """
    probs = np.zeros(int(distinct.max()) + 1, np.float64)
    probs[distinct] = counts
    return constriction.stream.model.Categorical(probs / probs.sum(), perfect=False)
