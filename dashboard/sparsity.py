"""How dense a delta is, per (layer, tensor kind): the numbers behind the sparsity heatmap.

A delta's header lists the tensors that changed with their element counts, so the grid needs no
decoding and no state. Tensors that did not change are absent from the header; pass the state's
names (or their shapes) to show them as density-0 cells instead of gaps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the env Space draws its boards with `dashboard` and installs no torch
    from delta import DeltaHeader

#: Row of the tensors outside the decoder layers (embeddings, final norm, lm_head).
NON_LAYER_ROW = "other"

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: Column order: attention, then its norms, then the MLP, then whatever else a layer holds, then the
#: tensors outside layers. Kinds not listed come after the listed ones of their group, sorted.
_LAYER_ORDER = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q_norm",
    "k_norm",
    "input_layernorm",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "down_proj",
)
_OTHER_ORDER = ("embed_tokens", "norm", "lm_head")
_PARAM_NAMES = ("weight",)


@dataclass(frozen=True)
class Cell:
    """The tensors of one (row, kind): how many elements they hold and how many changed."""

    row: str
    kind: str
    changed: int
    numel: int
    tensors: int

    @property
    def density(self) -> float:
        """Fraction of elements whose bits changed (0 for an empty cell)."""
        return self.changed / self.numel if self.numel else 0.0


@dataclass(frozen=True)
class SparsityGrid:
    """Density per (layer, kind) of one delta.

    Attributes:
        rows: ``"layer 0"``, ``"layer 1"``, ... in layer order, then :data:`NON_LAYER_ROW` if any
            tensor lives outside the layers.
        kinds: Column names (``q_proj``, ..., ``embed_tokens``, ``lm_head``).
        cells: The cells that hold at least one tensor; a (row, kind) pair without tensors is absent.
        version, base_version: From the header.
        changed, total: Changed and total elements of the whole state, from the header.
    """

    rows: tuple[str, ...]
    kinds: tuple[str, ...]
    cells: Mapping[tuple[str, str], Cell] = field(default_factory=dict)
    version: int | None = None
    base_version: int | None = None
    changed: int = 0
    total: int = 0

    @property
    def density(self) -> float:
        return self.changed / self.total if self.total else 0.0

    def cell(self, row: str, kind: str) -> Cell | None:
        return self.cells.get((row, kind))


#: PEFT's modules of a LoRA adapter's two matrices (its tensors' names end in ``<projection>.lora_A.weight``).
_LORA_MODULES = ("lora_A", "lora_B")


def kind_of(name: str) -> tuple[str, str]:
    """(row, kind) of a tensor name.

    The row is ``"layer i"`` for names holding ``layers.{i}.``, else :data:`NON_LAYER_ROW`. The kind is
    the innermost non-numeric module name, so experts of a MoE layer share their projection's kind;
    a parameter other than ``weight`` keeps its name (``q_proj.bias``).

        >>> kind_of("model.layers.3.self_attn.q_proj.weight")
        ('layer 3', 'q_proj')
        >>> kind_of("lm_head.weight")
        ('other', 'lm_head')
        >>> kind_of("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight")  # PEFT's name of an adapter's tensor
        ('layer 0', 'up_proj.lora_B')
    """
    match = _LAYER.search(name)
    row = f"layer {int(match.group(1))}" if match else NON_LAYER_ROW
    parts = name[match.end() :].split(".") if match else name.split(".")
    param = parts[-1] if len(parts) > 1 else ""
    modules = [p for p in (parts[:-1] if param else parts) if not p.isdigit()]
    if not modules:
        return row, param or name
    kind = modules[-1]
    if kind in _LORA_MODULES and len(modules) > 1:  # a LoRA adapter's tensor: its projection's column, A and B apart
        kind = f"{modules[-2]}.{kind}"
    if param and param not in _PARAM_NAMES:
        kind = f"{kind}.{param}"
    return row, kind


def _ordered(kinds: Iterable[str], order: Sequence[str]) -> list[str]:
    """`kinds` in `order`, then the rest: those of a module in `order` (``q_proj.lora_A``) in its order, then by
    name."""
    kinds = set(kinds)
    rank = {k: i for i, k in enumerate(order)}
    rest = sorted(kinds - set(order), key=lambda k: (rank.get(k.split(".")[0], len(order)), k))
    return [k for k in order if k in kinds] + rest


def sparsity(header: DeltaHeader, names: Iterable[str] | Mapping[str, Sequence[int]] | None = None) -> SparsityGrid:
    """Density per (layer, kind) of the delta ``header`` describes.

    Args:
        header: A delta's header (``delta.read_delta(...)[0]`` or ``RolloutService.last_delta()``).
        names: The state's tensor names, or a mapping name -> shape. Tensors named here but absent
            from the header (or listed with ``changed == 0``) count as unchanged: with shapes their
            elements join their cell's total; with names only, a cell made of them alone shows 0.

    Returns:
        The grid; the header is not modified.
    """
    changed: dict[str, tuple[int, int]] = {t.name: (t.changed, t.numel) for t in header.tensors}
    if names is not None:
        shapes = names if isinstance(names, Mapping) else dict.fromkeys(names)
        for name, shape in shapes.items():
            if name not in changed:
                changed[name] = (0, prod(shape) if shape is not None else 0)
    sums: dict[tuple[str, str], list[int]] = {}
    for name, (n_changed, numel) in changed.items():
        acc = sums.setdefault(kind_of(name), [0, 0, 0])
        acc[0] += n_changed
        acc[1] += numel
        acc[2] += 1
    cells = {key: Cell(key[0], key[1], c, n, t) for key, (c, n, t) in sums.items()}
    layers = sorted({r for r, _ in cells if r != NON_LAYER_ROW}, key=lambda r: int(r.split()[1]))
    rows = layers + ([NON_LAYER_ROW] if any(r == NON_LAYER_ROW for r, _ in cells) else [])
    kinds = _ordered({k for r, k in cells if r != NON_LAYER_ROW}, _LAYER_ORDER) + _ordered(
        {k for r, k in cells if r == NON_LAYER_ROW} - {k for r, k in cells if r != NON_LAYER_ROW}, _OTHER_ORDER
    )
    return SparsityGrid(
        rows=tuple(rows),
        kinds=tuple(kinds),
        cells=cells,
        version=header.version,
        base_version=header.base_version,
        changed=header.changed,
        total=header.total,
    )
