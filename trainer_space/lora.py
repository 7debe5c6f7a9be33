"""What a LoRA run publishes: the adapter's tensors, or the base with the adapter merged in (`wire.lora`).

TRL wraps the model with PEFT; the publish callback asks `lora_master` for the master tensors of the wrapped model:

- ``adapter``: the adapter's parameters under PEFT's names, sharing their storage.
- ``merged``: a read-only mapping under the checkpoint's names: an adapted weight is its base weight plus PEFT's
  `get_delta_weight` in float32, computed when read; the cast into the published state rounds it.

An adapter run on a bucket of an adapter run of the same settings and base resumes its latest adapter
(`stored_adapter`, `load_adapter`); a merged run cannot resume."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import torch

import delta
from wire.lora import LoraSettings
from wire.lora import check_targets as check_target_modules

from .config import TrainerConfig
from .weights import checkpoint_dtypes, pull

logger = logging.getLogger(__name__)


class LoraRefusedError(ValueError):
    """A LoRA run the trainer cannot honour (targets that are not the model's linear layers, a bucket holding
    versions it cannot resume): a setting to change, reported in one line, not a bug."""


#: PEFT's name of the one adapter a run trains (dropped from the published names, as PEFT does when it saves).
ADAPTER = "default"


def wrapped(model: torch.nn.Module) -> bool:
    """Whether `model` is a PEFT model (TRL wrapped it for a LoRA run)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def check_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> None:
    """Refuse, before anything trains, targets PEFT would adapt otherwise than asked.

    Raises:
        LoraRefusedError: a target that matches no module, or one that is not a linear layer (the line names the
            model's linear layers).
    """
    try:
        check_target_modules(dict(model.named_modules()), targets)
    except ValueError as e:
        raise LoraRefusedError(str(e)) from e


def lora_settings(config: TrainerConfig, base_hash: str) -> LoraSettings:
    """The run's `LoraSettings` for `config` (a LoRA run), on a base whose published state hashes to `base_hash`."""
    return LoraSettings(
        sync=config.lora_sync,
        r=config.lora_r,
        alpha=config.lora_alpha or 2.0 * config.lora_r,
        targets=config.lora_targets,
        base_model=config.model[-512:],
        base_hash=base_hash,
    )


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's parameters of a PEFT model under PEFT's saved names, sharing their storage, sorted by name.

    Raises:
        ValueError: the model holds no adapter (its target modules matched nothing).
    """
    tensors = {
        name.replace(f".{ADAPTER}.", "."): p.detach()
        for name, p in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }
    if not tensors:
        raise ValueError("the model holds no LoRA adapter: its target modules matched none of the model's modules")
    return dict(sorted(tensors.items()))


class MergedWeights(Mapping[str, torch.Tensor]):
    """The checkpoint's tensors (named by `folder`'s safetensors) of a PEFT `model` with its adapter merged in, computed
    when read (one B @ A per adapted weight; nothing cached, the model not modified).

    Raises:
        ValueError: a checkpoint tensor has no counterpart in the model.
    """

    def __init__(self, model: torch.nn.Module, folder: str) -> None:
        from peft.tuners.lora import LoraLayer

        base = model.get_base_model()  # type: ignore[operator]  # a PeftModel's
        params = base.state_dict(keep_vars=False)
        self._layers: dict[str, LoraLayer] = {}
        self._plain: dict[str, torch.Tensor] = {}
        for name in checkpoint_dtypes(folder):
            path, _, leaf = name.rpartition(".")
            module = base.get_submodule(path) if path else base
            if isinstance(module, LoraLayer) and leaf == "weight":
                self._layers[name] = module
            elif name in params:
                self._plain[name] = params[name].detach()
            else:
                raise ValueError(
                    f"the model has no tensor named {name!r}: the trainer publishes under the "
                    "checkpoint's names, so they must match"
                )
        self._names = sorted([*self._layers, *self._plain])

    def __getitem__(self, name: str) -> torch.Tensor:
        layer = self._layers.get(name)
        if layer is None:
            return self._plain[name]
        with torch.no_grad():
            return layer.get_base_layer().weight.detach() + layer.get_delta_weight(ADAPTER)  # type: ignore[attr-defined,operator]  # LoRA layers define it

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def lora_master(model: torch.nn.Module, folder: str, sync: str) -> Mapping[str, torch.Tensor]:
    """The master tensors the publish callback casts into the published state for a PEFT `model` (see the module
    docstring): `adapter_tensors` or `MergedWeights`."""
    return adapter_tensors(model) if sync == "adapter" else MergedWeights(model, folder)


def stored_adapter(
    bucket: delta.Bucket,
    newest: int,
    own: int,
    lora: LoraSettings,
    previous: LoraSettings | None,
    manifest: delta.Manifest | None = None,
) -> dict[str, torch.Tensor] | None:
    """What a LoRA run resumes from `bucket`: None when it holds none of this trainer's versions (`newest`, `own`: the
    bucket's latest and the trainer's last own version); else, for an adapter run of the settings before it
    (`previous`), the adapter's tensors at `own`, read from `manifest` (the trainer's resume; None: the newest).

    Raises:
        LoraRefusedError: the bucket holds versions this run cannot resume (a merged run's, an adapter of other
            settings or base, versions without a LoRA run's settings); use a new bucket.
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    if not newest:
        return None
    held = f"bucket {bucket.url} holds version {newest}"
    if lora.sync == "merged":
        raise LoraRefusedError(
            f"{held}: a merged LoRA run starts on an empty bucket (resuming one is not built: the "
            "merged weights do not give the adapter back); start it with a new --bucket, and train "
            "with --lora-sync adapter where a run must resume"
        )
    if previous is None:
        raise LoraRefusedError(
            f"{held} and no LoRA run's settings beside it: a LoRA run resumes only an adapter; use a new bucket"
        )
    mine = (lora.sync, lora.r, lora.alpha, lora.targets, lora.base_hash)
    theirs = (previous.sync, previous.r, previous.alpha, previous.targets, previous.base_hash)
    if mine != theirs:
        fields = ", ".join(
            f"{n} {a!r} (this run: {b!r})"
            for n, a, b in zip(("sync", "r", "alpha", "targets", "base"), theirs, mine, strict=True)
            if a != b
        )
        raise LoraRefusedError(
            f"{held}, written by a LoRA run of other settings: {fields}; use a new bucket or its settings"
        )
    if not own:
        return None
    logger.info("resuming the LoRA adapter from %s at version %d", bucket.url, own)
    return pull(bucket, own, manifest)


@torch.no_grad()
def load_adapter(adapter: Mapping[str, torch.Tensor], stored: Mapping[str, torch.Tensor]) -> None:
    """Copy a resumed adapter's tensors into the PEFT model's, bit for bit, after checking names, shapes and dtypes.

    Raises:
        delta.StateMismatchError: the stored adapter is not this model's.
    """
    if set(adapter) != set(stored):
        extra = sorted(set(adapter) ^ set(stored))[:3]
        raise delta.StateMismatchError(f"the bucket's adapter holds other tensors than the model's (e.g. {extra})")
    for name, tensor in adapter.items():
        src = stored[name]
        if src.shape != tensor.shape or src.dtype != tensor.dtype:
            raise delta.StateMismatchError(
                f"{name}: the bucket's adapter has {src.dtype} {tuple(src.shape)}, the "
                f"model's {tensor.dtype} {tuple(tensor.shape)}"
            )
    for name, tensor in adapter.items():
        tensor.copy_(stored[name])
