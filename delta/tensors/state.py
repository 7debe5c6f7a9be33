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
        DeltaFormatError: a file is not valid safetensors.
    """
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
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


def save_state(state: Mapping[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a state as one safetensors file, atomically and durably (`delta.atomic`)."""
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata=metadata)


def check_same_layout(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> None:
    """Raise StateMismatchError unless both states have the same names, shapes and dtypes."""
    missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if missing or extra:
        raise StateMismatchError(f"the states hold different tensors (only in old: {missing[:5]}, only in new: "
                                 f"{extra[:5]}); a delta carries changed values, publish an anchor instead")
    for name in sorted(old):
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise StateMismatchError(f"old is {a.dtype} {tuple(a.shape)}, new is {b.dtype} {tuple(b.shape)}",
                                     tensor=name)
