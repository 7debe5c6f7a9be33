"""The vLLM worker extension that loads changed weights: runs inside vLLM's worker process.

vLLM mixes this class into its worker (`worker_extension_cls`), and `VLLMEngine` calls its methods
through `collective_rpc`. Tensors do not travel through that channel: the engine writes them to a
safetensors file and passes its path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# A partial reload is the point: vLLM warns for every parameter and layer left as it was.
_QUIET_LOGGERS = ("vllm.model_executor.model_loader.reload.inplace", "vllm.model_executor.model_loader.reload.layerwise")


@contextlib.contextmanager
def _quiet_partial_reload() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _repack_tied_lm_head(model: "torch.nn.Module") -> None:
    """Pack a tied lm_head again from the embedding it shares (its packed GEMM copy is stale after a reload)."""
    lm_head = getattr(model, "lm_head", None)
    weight = getattr(lm_head, "weight", None)
    if weight is None:
        return
    tied = any(p is weight for name, p in model.named_parameters(remove_duplicate=False)
               if not name.startswith("lm_head."))
    if tied:
        lm_head.quant_method.process_weights_after_loading(lm_head)


class WeightUpdateExtension:
    """Methods added to vLLM's worker (`self` is the worker: `self.model_runner`, `self.reload_weights`)."""

    def packed_modules(self) -> dict[str, list[str]]:
        """The model's fused layers: fused name -> checkpoint names loaded into it (qkv_proj -> q/k/v)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return {k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()}

    def load_weights_file(self, path: str) -> int:
        """Reload the checkpoint-format tensors in the safetensors file at `path`; returns how many.

        `reload_weights(is_checkpoint_format=True)` runs vLLM's own loaders and post-processing layer by
        layer, so fused and repacked layers (CPU GEMM packing) are rebuilt from checkpoint tensors. A
        fused layer is processed from whatever it received: the file must hold every member of a group.
        On CPU a tied lm_head keeps a packed copy of the embedding, so it is packed again.
        """
        from safetensors import safe_open
        from vllm.platforms import current_platform

        with safe_open(path, framework="pt") as f, _quiet_partial_reload():
            names = list(f.keys())
            self.reload_weights(  # type: ignore[attr-defined]
                weights_iterator=((name, f.get_tensor(name)) for name in names), is_checkpoint_format=True)
        if current_platform.is_cpu():
            _repack_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
        return len(names)
