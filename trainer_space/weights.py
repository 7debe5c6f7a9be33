"""The published state: which of the model's tensors go to the bucket, in which dtype, and resuming.

The trainer keeps fp32 *master* weights (the optimizer's updates smaller than half a bf16 ULP add up
instead of being lost) and publishes their cast to the checkpoint's dtypes: the names, shapes and
dtypes of the model folder's safetensors files — what a rollout engine loads and follows — so a tied
`lm_head.weight` (absent from the files) is not published twice. The published tensors live on the
master weights' device; `cast_into` refreshes them after each optimizer step, in place.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

import delta

logger = logging.getLogger(__name__)


def checkpoint_dtypes(folder: str) -> dict[str, torch.dtype]:
    """Name -> dtype of every tensor in a model folder's safetensors files (sharded or not)."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in model folder {folder!r}")
    dtypes: dict[str, torch.dtype] = {}
    for name in files:
        with safe_open(os.path.join(folder, name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors file has keys() and no __iter__
                code = f.get_slice(key).get_dtype()
                if code not in _DTYPES:
                    raise ValueError(
                        f"{folder}/{name}: tensor {key} is {code}; the trainer publishes {sorted(_DTYPES)} tensors"
                    )
                dtypes[key] = _DTYPES[code]
    return dict(sorted(dtypes.items()))


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def master_tensors(model: torch.nn.Module, folder: str) -> dict[str, torch.Tensor]:
    """The model's parameters under the checkpoint's names, sharing their storage (the master weights).

    Raises:
        ValueError: a checkpoint tensor has no counterpart in the model (it renames weights).
    """
    params = model.state_dict(keep_vars=False)
    names = list(checkpoint_dtypes(folder))
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(
            f"the model has no tensor named {missing[:3]} (of {len(missing)} in {folder}); "
            "the trainer publishes under the checkpoint's names, so they must match"
        )
    return {n: params[n].detach() for n in names}


def published_state(master: dict[str, torch.Tensor], folder: str) -> dict[str, torch.Tensor]:
    """New tensors holding `master` cast to the checkpoint's dtypes, on the master weights' device."""
    dtypes = checkpoint_dtypes(folder)
    return {n: t.to(dtypes[n], copy=True) for n, t in master.items()}


@torch.no_grad()
def cast_into(dst: dict[str, torch.Tensor], src: Mapping[str, torch.Tensor]) -> None:
    """Copy each tensor of `src` into `dst`'s tensor of that name, in place (rounding to nearest even)."""
    for name, tensor in dst.items():
        tensor.copy_(src[name])


def pull_into(
    state: dict[str, torch.Tensor], bucket: delta.Bucket, version: int, manifest: delta.Manifest | None = None
) -> str:
    """Load `bucket`'s `version` into `state` in place (bit for bit, every file and the trainer's signature checked
    with the bucket's trust: the trainer's own key), from `manifest` as `pull` does; return the state hash of what was
    loaded.

    Raises:
        delta.StateMismatchError: the bucket holds another model (names, shapes or dtypes differ).
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    stored = pull(bucket, version, manifest)
    if set(stored) != set(state):
        extra = sorted(set(stored) ^ set(state))[:3]
        raise delta.StateMismatchError(
            f"bucket {bucket.url} holds other tensors than the model (e.g. {extra}): "
            "use another bucket or the model it was trained from"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            src = stored[name]
            if src.shape != tensor.shape or src.dtype != tensor.dtype:
                raise delta.StateMismatchError(
                    f"{name}: bucket has {src.dtype} {tuple(src.shape)}, the model {tensor.dtype} {tuple(tensor.shape)}"
                )
            tensor.copy_(src)
    logger.info("resumed from %s at version %d", bucket.url, version)
    return delta.state_digest(state).hexdigest  # what was loaded, hashed: the proof it is the bucket's version


def pull(bucket: delta.Bucket, version: int, manifest: delta.Manifest | None = None) -> dict[str, torch.Tensor]:
    """`bucket`'s `version`, read whole (every file and the signature checked with the bucket's trust) from `manifest`:
    the trainer's resume (`Bucket.resume`: its own versions), so that a version a stolen key signed under the same
    number in a newer manifest is never read; None: from the newest manifest.

    Raises:
        delta.DeltaError, OSError: the bucket cannot be read, or holds no such version.
    """
    if manifest is not None:
        return bucket.read_version(manifest, version)
    with delta.Subscriber(bucket) as sub:
        if sub.sync(version) != version or sub.state is None:
            raise delta.NoPathError(f"{bucket.url} holds no version {version} to resume", target=version)
        return dict(sub.state)
