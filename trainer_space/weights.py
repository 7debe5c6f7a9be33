"""The published state: which of the model's tensors go to the bucket, and resuming from the bucket.

The published state has the names, shapes and dtypes of the model folder's safetensors files — what
a rollout engine loads and follows — so a tied `lm_head.weight` (absent from the files) is not
published twice. Its tensors share storage with the model's parameters: the optimizer's in-place
updates show through without copying.
"""

from __future__ import annotations

import json
import logging
import os

import torch

import delta
from delta.manifest import read_manifest

logger = logging.getLogger(__name__)


def checkpoint_names(folder: str) -> list[str]:
    """Tensor names stored in a model folder's safetensors files (sharded or not)."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(json.load(f)["weight_map"])
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in model folder {folder!r}")
    names: list[str] = []
    for name in files:
        with safe_open(os.path.join(folder, name), "pt") as f:
            names.extend(f.keys())
    return sorted(names)


def published_state(model: torch.nn.Module, folder: str) -> dict[str, torch.Tensor]:
    """The model's tensors under the checkpoint's names, sharing the parameters' storage.

    Raises:
        ValueError: a checkpoint tensor has no counterpart in the model (it renames weights).
    """
    params = model.state_dict(keep_vars=False)
    names = checkpoint_names(folder)
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"the model has no tensor named {missing[:3]} (of {len(missing)} in {folder}); "
                         "the trainer publishes under the checkpoint's names, so they must match")
    return {n: params[n].detach() for n in names}


def resume(state: dict[str, torch.Tensor], bucket: str) -> int:
    """Load the bucket's latest version into `state` in place (bit for bit); return it (0: empty bucket).

    Raises:
        delta.StateMismatchError: the bucket holds another model (names, shapes or dtypes differ).
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    storage = delta.open_storage(bucket)
    manifest = read_manifest(storage)
    if manifest is None or manifest.latest is None:
        return 0
    sub = delta.Subscriber(storage)
    try:
        version = sub.sync(manifest.latest.version)
        stored = sub.state
    finally:
        sub.close()
    if stored is None or set(stored) != set(state):
        extra = sorted(set(stored or {}) ^ set(state))[:3]
        raise delta.StateMismatchError(f"bucket {bucket} holds other tensors than the model (e.g. {extra}): "
                                       "use another bucket or the model it was trained from")
    with torch.no_grad():
        for name, tensor in state.items():
            src = stored[name]
            if src.shape != tensor.shape or src.dtype != tensor.dtype:
                raise delta.StateMismatchError(f"{name}: bucket has {src.dtype} {tuple(src.shape)}, the model "
                                               f"{tensor.dtype} {tuple(tensor.shape)}")
            tensor.copy_(src)
    logger.info("resumed from %s at version %d", bucket, version)
    return int(version)
