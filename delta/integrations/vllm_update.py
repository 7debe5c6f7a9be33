"""The file a `delta` update hands to vLLM's worker, and the worker's handshake file: both sides of the wire.

vLLM passes update info between processes as JSON, so tensors travel as a path to a safetensors file
that the sender (the `delta follow` sidecar, or `VLLMEngine`) writes beside the server and the worker
reads. The sender has already decoded the delta and proved the target hash; the file holds only
values to write, in checkpoint names:

- a dense entry: key `name`, the full new tensor (checkpoint shape and dtype);
- a sparse entry: key `name`, the new values (1-D) and key `name + SPARSE_SUFFIX`, their flat positions
  (int64); the metadata key `sparse` lists (JSON) each sparse name with its full shape.

The CPU path takes dense entries only, and every fused group (q/k/v, gate/up) whole: vLLM rebuilds a
fused layer from what it receives. The CUDA path takes both (sparse ones are written in place).

Imports torch and safetensors only: this module runs inside vLLM's worker.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "delta-vllm-update"
FORMAT_VERSION = "1"
SPARSE_SUFFIX = "#positions"
#: Above this share of changed elements a tensor goes dense (a sparse patch costs positions + a full temporary).
DENSE_ABOVE = 1 / 3

__all__ = [
    "SparseEntry",
    "Update",
    "WorkerInfo",
    "changed_positions",
    "fused_groups",
    "handshake_path",
    "read_update",
    "read_worker_info",
    "siblings",
    "whole_groups",
    "write_update",
    "write_worker_info",
]


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker tells its sender at the handshake (`init_weight_transfer_engine`).

    Attributes:
        device: The worker's device type: "cpu" (layerwise reload of whole fused groups) or "cuda" (in place).
        packed_modules: The model's fused layers: fused name -> checkpoint names loaded into it.
        vllm_version: The vLLM the worker runs.
    """

    device: str
    packed_modules: dict[str, list[str]]
    vllm_version: str

    @property
    def in_place(self) -> bool:
        """True when the worker writes changed elements in place (sparse entries allowed)."""
        return self.device == "cuda"


def handshake_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"worker-{rank}.json")


def write_worker_info(folder: str, rank: int, info: WorkerInfo) -> None:
    """Write this worker's `WorkerInfo` where the sender reads it (atomically: a reader never sees half)."""
    path = handshake_path(folder, rank)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"device": info.device, "packed_modules": info.packed_modules, "vllm": info.vllm_version}, f)
    os.replace(tmp, path)


def read_worker_info(folder: str, rank: int = 0) -> WorkerInfo:
    """Read the `WorkerInfo` a worker wrote at the handshake.

    Raises:
        FileNotFoundError: no worker wrote there (the server does not run the `delta` backend, or the
            folder is not shared between this process and the server).
    """
    path = handshake_path(folder, rank)
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f'no worker handshake at {path}: start vLLM with --weight-transfer-config \'{{"backend":"delta"}}\' '
            "and give it a folder both processes can reach"
        ) from e
    return WorkerInfo(raw["device"], {k: list(v) for k, v in raw["packed_modules"].items()}, raw["vllm"])


def fused_groups(names: Iterable[str], packed_modules: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Checkpoint name -> the names loaded into the same fused layer (itself included).

    `packed_modules` is the model's `packed_modules_mapping` (e.g. qkv_proj -> [q_proj, k_proj, v_proj]);
    a name whose module is not fused maps to itself alone.
    """
    known = set(names)
    return {name: [s for s in siblings(name, packed_modules) if s in known] for name in sorted(known)}


def siblings(name: str, packed_modules: Mapping[str, list[str]]) -> list[str]:
    """Every checkpoint name loaded into the same fused layer as `name` (itself included), whether the
    model has them or not; `[name]` when its module is not fused."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        members = next((m for m in packed_modules.values() if part in m), None)
        if members is not None:
            return [".".join(parts[:i] + [m] + parts[i + 1 :]) for m in members]
    return [name]


def whole_groups(changed: Iterable[str], groups: Mapping[str, list[str]]) -> list[str]:
    """The changed names completed with every member of their fused groups, sorted."""
    return sorted({m for name in changed for m in groups.get(name, [name])})


def changed_positions(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Flat positions (int64) where the bit patterns of `new` and `old` differ."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[new.element_size()]
    return torch.nonzero(new.reshape(-1).view(width) != old.reshape(-1).view(width)).reshape(-1)


def write_update(path: str, new: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor] | None = None) -> int:
    """Write an update file of the tensors in `new`; returns its size in bytes.

    With `old` (the values the worker holds now, same names), a tensor whose new values hold no NaN (NaN
    marks "unchanged" in vLLM's sparse loader) and of which at most `DENSE_ABOVE` changed goes as a sparse
    entry; every other tensor goes dense. Without `old`, all go dense. Never modifies the tensors.
    """
    tensors: dict[str, torch.Tensor] = {}
    sparse: dict[str, list[int]] = {}
    for name in sorted(new):
        tensor = new[name].detach().to("cpu").contiguous()
        if old is not None and tensor.is_floating_point() and not torch.isnan(tensor).any():
            positions = changed_positions(tensor, old[name].detach().to("cpu").contiguous())
            if positions.numel() <= DENSE_ABOVE * tensor.numel():
                tensors[name] = tensor.reshape(-1)[positions].clone()
                tensors[name + SPARSE_SUFFIX] = positions
                sparse[name] = list(tensor.shape)
                continue
        tensors[name] = tensor
    tmp = f"{path}.tmp{os.getpid()}"
    save_file(tensors, tmp, metadata={"format": FORMAT, "format_version": FORMAT_VERSION, "sparse": json.dumps(sparse)})
    os.replace(tmp, path)
    return os.path.getsize(path)


@dataclass(frozen=True)
class SparseEntry:
    """One sparse entry of an update file: new `values` at flat `positions` of a tensor of `shape`."""

    name: str
    shape: tuple[int, ...]
    positions: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class Update:
    """An update file, read: dense tensors by name and sparse entries."""

    dense: dict[str, torch.Tensor]
    sparse: list[SparseEntry]

    @property
    def names(self) -> list[str]:
        return sorted([*self.dense, *(e.name for e in self.sparse)])


def read_update(path: str) -> Update:
    """Read an update file written by `write_update`.

    Raises:
        FileNotFoundError: no file at `path` (it must be on a filesystem the worker can read).
        ValueError: not an update file, or a sparse entry whose positions fall outside its tensor.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no update file at {path}: the sender must write it where the vLLM worker can read it")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} is not a {FORMAT} v{FORMAT_VERSION} file (metadata {meta}); write it with "
                "delta.integrations.vllm_update.write_update of the same delta version"
            )
        shapes = {name: tuple(shape) for name, shape in json.loads(meta.get("sparse", "{}")).items()}
        dense: dict[str, torch.Tensor] = {}
        sparse: list[SparseEntry] = []
        for key in f.keys():  # noqa: SIM118 - a safetensors file has keys() and no __iter__
            if key.endswith(SPARSE_SUFFIX):
                continue
            if key in shapes:
                positions, values = f.get_tensor(key + SPARSE_SUFFIX), f.get_tensor(key)
                numel = math.prod(shapes[key])
                if positions.numel() != values.numel() or (
                    positions.numel() and not 0 <= int(positions.min()) <= int(positions.max()) < numel
                ):
                    raise ValueError(
                        f"{path}: sparse entry {key!r} has positions outside its {numel} elements "
                        "or a count other than its values'"
                    )
                sparse.append(SparseEntry(key, shapes[key], positions, values))
            else:
                dense[key] = f.get_tensor(key)
    return Update(dense, sparse)
