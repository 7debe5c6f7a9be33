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

import constriction
import numpy as np

from ..errors import DeltaFormatError
from ._streams import pack, unpack

Key = tuple[str, int, int]  # (kind: "gap" | "step", width in bits, class)

KINDS = ("gap", "step")
DIRECT = {"gap": 16, "step": 64}  # values below are symbols themselves; above: bucket + raw bits
MAX_RAW_BITS = 20  # constriction's uniform model takes sizes < 2**24
MAX_CONTEXT_SYMBOLS = 2**32 - 1


def _alphabet(direct: int) -> tuple[int, int]:
    """(number of symbols, escape symbol) for a given direct range."""
    first_bucket_bits = int(direct).bit_length()
    escape = direct + (MAX_RAW_BITS + 1 - first_bucket_bits) + 1
    return escape + 1, escape


def symbolise(values: np.ndarray, direct: int):
    """Split values into (symbols, raw remainders, raw sizes, escaped values).

    v < direct: the symbol is v. Otherwise v has b significant bits: the symbol names b, and the
    b-1 bits below the leading one travel as a uniform remainder; beyond MAX_RAW_BITS the value is
    escaped and stored verbatim.
    """
    values = values.astype(np.uint64, copy=False)
    _, escape = _alphabet(direct)
    bitlen = np.zeros(values.shape, np.int64)
    big = values >= direct
    if big.any():
        bitlen[big] = np.floor(np.log2(values[big].astype(np.float64))).astype(np.int64) + 1
        # float64 log2 can be off by one near powers of two for huge values: correct exactly.
        high = big & (bitlen < 64) & (values >= (np.uint64(1) << np.minimum(bitlen, 63).astype(np.uint64)))
        bitlen[high] += 1
        low = big & (bitlen > 1) & (values < (np.uint64(1) << (bitlen - 1).astype(np.uint64)))
        bitlen[low] -= 1
    symbols = np.where(big, direct + bitlen - int(direct).bit_length(), values.astype(np.int64))
    escaped = big & (bitlen - 1 > MAX_RAW_BITS)
    symbols[escaped] = escape
    bucketed = big & ~escaped
    raw_bits = (bitlen[bucketed] - 1).astype(np.uint64)
    raw = (values[bucketed] - (np.uint64(1) << raw_bits)).astype(np.int32)
    return symbols.astype(np.int32), raw, (np.int64(1) << raw_bits.astype(np.int64)).astype(np.int32), values[escaped]


def desymbolise(symbols: np.ndarray, direct: int, raw_reader, escapes_reader) -> np.ndarray:
    """Inverse of `symbolise`; pulls remainders and escapes from the given callables."""
    _, escape = _alphabet(direct)
    symbols = symbols.astype(np.int64)
    out = symbols.astype(np.uint64)
    bucketed = (symbols >= direct) & (symbols != escape)
    raw_bits = (symbols[bucketed] - direct + int(direct).bit_length() - 1).astype(np.uint64)
    sizes = (np.int64(1) << raw_bits.astype(np.int64)).astype(np.int32)
    out[bucketed] = (np.uint64(1) << raw_bits) + raw_reader(sizes).astype(np.uint64)
    escaped = symbols == escape
    out[escaped] = escapes_reader(int(escaped.sum()))
    return out


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
    """Each (kind, width, class) context coded under rANS with its own empirical model."""

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
            symbols, raw, sizes, escaped = symbolise(values, DIRECT[kind])
            escapes.append(escaped)
            distinct, counts = np.unique(symbols, return_counts=True)
            coder = constriction.stream.stack.AnsCoder()
            if raw.size:
                coder.encode_reverse(raw, constriction.stream.model.Uniform(), sizes)
            if distinct.size > 1:  # a single symbol carries no information (and is no valid model)
                coder.encode_reverse(symbols, _model(distinct, counts, _alphabet(DIRECT[kind])[0]))
            compressed = coder.get_compressed()
            words.append(compressed)
            table += [KINDS.index(kind), width, cls, values.size, compressed.size, distinct.size]
            table += np.stack([distinct, counts], axis=1).reshape(-1).tolist()
        return {
            "models": pack(np.asarray(table, np.uint32)),
            "ans": np.concatenate(words).astype("<u4").tobytes() if words else b"",
            "escapes": pack(np.concatenate(escapes).astype(np.uint64)) if escapes else pack(np.zeros(0, np.uint64)),
        }

    def decode(self, blobs: dict[str, bytes], counts: dict[Key, int]) -> dict[Key, np.ndarray]:
        for name in ("models", "ans", "escapes"):
            if name not in blobs:
                raise DeltaFormatError(f"stream {name!r} is missing")
        max_rows = sum(6 + 2 * _alphabet(DIRECT[k[0]])[0] for k in counts)
        table = unpack(blobs["models"], np.uint32, None, "models", max_rows).astype(np.int64)
        ans = np.frombuffer(blobs["ans"], "<u4") if len(blobs["ans"]) % 4 == 0 else None
        if ans is None:
            raise DeltaFormatError("stream 'ans' is not a whole number of 32-bit words")
        escapes = unpack(blobs["escapes"], np.uint64, None, "escapes", sum(counts.values()))
        out: dict[Key, np.ndarray] = {}
        at = word_at = escape_at = 0
        while at < table.size:
            if at + 6 > table.size:
                raise DeltaFormatError("stream 'models' ends inside a context header")
            kind_i, width, cls, n, n_words, n_distinct = (int(x) for x in table[at:at + 6])
            pairs = table[at + 6:at + 6 + 2 * n_distinct].reshape(-1, 2)
            at += 6 + 2 * n_distinct
            if kind_i >= len(KINDS) or pairs.shape[0] != n_distinct:
                raise DeltaFormatError("stream 'models' is malformed")
            key = (KINDS[kind_i], width, cls)
            if key in out or n == 0 or counts.get(key) != n:
                raise DeltaFormatError(f"context {key} holds {n} symbols, the class table needs {counts.get(key)}")
            alphabet = _alphabet(DIRECT[key[0]])[0]
            distinct, freq = pairs[:, 0], pairs[:, 1]
            if (distinct >= alphabet).any() or (freq <= 0).any() or int(freq.sum()) != n or word_at + n_words > ans.size:
                raise DeltaFormatError(f"model of context {key} is malformed")
            coder = constriction.stream.stack.AnsCoder(ans[word_at:word_at + n_words].astype(np.uint32))
            word_at += n_words
            try:
                if n_distinct > 1:
                    symbols = coder.decode(_model(distinct, freq, alphabet), n)
                else:
                    symbols = np.full(n, distinct[0] if n_distinct else 0, np.int32)
                if (symbols < 0).any() or (symbols >= alphabet).any():
                    raise DeltaFormatError(f"context {key} decodes to symbols outside its alphabet")

                def raw_reader(sizes: np.ndarray) -> np.ndarray:
                    if not sizes.size:
                        return np.zeros(0, np.int32)
                    return coder.decode(constriction.stream.model.Uniform(), sizes)

                def escapes_reader(k: int) -> np.ndarray:
                    nonlocal escape_at
                    if escape_at + k > escapes.size:
                        raise DeltaFormatError("stream 'escapes' ends early")
                    escape_at += k
                    return escapes[escape_at - k:escape_at]

                out[key] = desymbolise(symbols, DIRECT[key[0]], raw_reader, escapes_reader)
            except (ValueError, RuntimeError, AssertionError) as e:
                raise DeltaFormatError(f"context {key} does not decode: {e}") from e
            if not coder.is_empty():
                raise DeltaFormatError(f"context {key} has data left over after decoding")
        if word_at != ans.size or escape_at != escapes.size:
            raise DeltaFormatError("streams 'ans' or 'escapes' hold data no context uses")
        missing = set(k for k, n in counts.items() if n) - set(out)
        if missing:
            raise DeltaFormatError(f"contexts {sorted(missing)[:3]} are missing from 'models'")
        return out

    def stream_names(self, counts: Iterable[Key]) -> set[str]:
        return {"models", "ans", "escapes"}


def _model(distinct: np.ndarray, counts: np.ndarray, alphabet: int):
    """Categorical model over the whole alphabet from exact counts (zero for absent symbols)."""
    probs = np.zeros(alphabet, np.float64)
    probs[distinct] = counts
    return constriction.stream.model.Categorical(probs / probs.sum(), perfect=False)
