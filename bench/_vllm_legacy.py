"""Today's (before the `delta` backend) vLLM update path, kept as the baseline of `bench.vllm_backend`.

The engine wrote the changed tensors (whole fused groups) to a file and called its own worker extension
through `collective_rpc`, which ran the worker's `reload_weights(..., is_checkpoint_format=True)` and
repacked a tied lm_head on CPU. Same data, same groups: only the update path differs. A white-box tool:
it borrows the backend's private helpers (`_quiet_partial_reload`, `_repack_tied_lm_head`) so that both
paths reload and repack alike.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import torch
from safetensors.torch import save_file

from delta.integrations.vllm_backend import _quiet_partial_reload, _repack_tied_lm_head
from delta.integrations.vllm_update import whole_groups
from delta_vllm_plugin import RegisterDeltaBackend
from rollout_space.engines.vllm_engine import VLLMEngine


class WeightUpdateExtension(RegisterDeltaBackend):
    """The former worker extension (`self` is vLLM's worker)."""

    def load_weights_file(self, path: str) -> int:
        from safetensors import safe_open
        from vllm.platforms import current_platform

        with safe_open(path, framework="pt") as f, _quiet_partial_reload():
            names = list(f.keys())
            self.reload_weights(  # type: ignore[attr-defined]  # the vLLM worker this class extends has it
                weights_iterator=((name, f.get_tensor(name)) for name in names), is_checkpoint_format=True
            )
        if current_platform.is_cpu():
            _repack_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]  # the worker's
        return len(names)


class LegacyVLLMEngine(VLLMEngine):
    """`VLLMEngine` updating through the former worker extension instead of the weight-transfer API."""

    worker_extension = "bench._vllm_legacy.WeightUpdateExtension"

    def _load(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        names = whole_groups(changed, self._groups)
        tensors = {n: (changed[n] if n in changed else self.state[n]).contiguous() for n in names}
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=self._tmp_dir)
        os.close(fd)
        try:
            save_file(tensors, path)
            self._llm.collective_rpc("load_weights_file", args=(path,))
        finally:
            os.unlink(path)
        self._llm.reset_prefix_cache()
