"""Model states (name -> tensor) from and to safetensors files and Hugging Face model folders."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path
from ..errors import DeltaFormatError, StateMismatchError

State = dict[str, torch.Tensor]


def load_state(path: str) -> State:
    """Load a state from a `.safetensors` file or a model folder (one file, or shards with an index).

    Raises:
        FileNotFoundError: nothing at `path`, or a folder without safetensors files.
        DeltaFormatError: a file is not valid safetensors, or the folder's index is malformed.
    """
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            files = index_files(index)
        else:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files in folder {path!r}")
        state: State = {}
        for name in files:
            state.update(load_state(os.path.join(path, name)))
        return state
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or folder: {path!r}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise DeltaFormatError(f"cannot read as safetensors: {e}", path=path) from e


def index_files(index: str) -> list[str]:
    """The shard files a `model.safetensors.index.json` names (its `weight_map`'s values), checked: a JSON
    object whose `weight_map` maps tensor names to file names inside the folder.

    Raises:
        DeltaFormatError: in one line, what is wrong with the index.
    """
    try:
        with open(index, "rb") as f:
            body = json.loads(f.read())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DeltaFormatError(f"not valid JSON: {e}", path=index) from None
    weights = body.get("weight_map") if isinstance(body, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise DeltaFormatError("expected a JSON object with a non-empty 'weight_map' object", path=index)
    files = set()
    for name, file in weights.items():
        if (
            not isinstance(file, str)
            or not file.endswith(".safetensors")
            or os.path.basename(file) != file
            or file.startswith(".")
        ):
            raise DeltaFormatError(
                f"weight_map[{name!r:.60}] must name a .safetensors file in the folder, got {file!r:.80}", path=index
            )
        files.add(file)
    return sorted(files)


def save_state(state: Mapping[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a state as one safetensors file, atomically and durably (`delta.atomic`)."""
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata=metadata)


def check_same_layout(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> None:
    """Raise StateMismatchError unless both states have the same names, shapes and dtypes."""
    missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if missing or extra:
        raise StateMismatchError(
            f"the states hold different tensors (only in old: {missing[:5]}, only in new: "
            f"{extra[:5]}); a delta carries changed values, publish an anchor instead"
        )
    for name in sorted(old):
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise StateMismatchError(
                f"old is {a.dtype} {tuple(a.shape)}, new is {b.dtype} {tuple(b.shape)}", tensor=name
            )
