"""The conditional entropy bound: bits needed for a delta if every element were coded knowing the
exponent of its old value (changed or not, then by how many ULPs), under an ideal adaptive model.

This is the reference the default codec is measured against, not a codec: it counts information,
it writes nothing. A white-box tool: it reads states through `delta`'s own bit views
(`delta.tensors.bits`), the ones the codecs condition on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

import numpy as np
import torch

from delta.tensors.bits import bits, layout_of, order_key, zigzag


def _h(counts: np.ndarray) -> float:
    """Total bits to code `counts.sum()` symbols with the empirical distribution `counts`."""
    counts = counts[counts > 0].astype(np.float64)
    total = counts.sum()
    return float(-(counts * np.log2(counts / total)).sum()) if total else 0.0


def conditional_entropy_bits(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> float:
    """Bits for positions + values of the whole delta, conditioned on (dtype, old exponent).

    Statistics are pooled over all tensors of the same dtype per exponent class: a model whose
    parameters a real coder would have to send too, so the bound is slightly optimistic.
    """
    sizes: dict[tuple, int] = defaultdict(int)
    changed: dict[tuple, int] = defaultdict(int)
    steps: dict[tuple, Counter] = defaultdict(Counter)
    for name in sorted(old):
        a, b = bits(old[name].contiguous()), bits(new[name].contiguous())
        layout = layout_of(old[name].dtype)
        classes = (a >> a.dtype.type(layout.shift)) & a.dtype.type(layout.mask)
        class_sizes = np.bincount(classes, minlength=layout.classes)
        where = np.flatnonzero(a != b)
        changed_classes, step_of = classes[where], zigzag(order_key(b[where]) - order_key(a[where]))
        for c in np.flatnonzero(class_sizes):
            sizes[(old[name].dtype, int(c))] += int(class_sizes[c])
        for c in np.unique(changed_classes).tolist():
            key = (old[name].dtype, int(c))
            in_class = step_of[changed_classes == c]
            changed[key] += in_class.size
            values, counts = np.unique(in_class, return_counts=True)
            steps[key].update(dict(zip(values.tolist(), counts.tolist(), strict=True)))
    total = 0.0
    for key, n in sizes.items():
        k = changed.get(key, 0)
        total += _h(np.array([k, n - k]))
        if k:
            total += _h(np.array(list(steps[key].values())))
    return total
