"""The plain transformers engine: the model in this process (CPU or one GPU), for small machines and fast tests."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import delta
from models.interrupt import Breaker, Interrupted
from wire.lora import MAX_ADAPTER_RANK, LoraSettings

from .base import DTYPES, Engine, EngineConfig, Sampled, SamplingParams, compute_dtype

#: PEFT's name of the one adapter served (not in the published names, as PEFT saves them).
ADAPTER = "default"


class TransformersEngine(Engine):
    """Runs the model with transformers in the calling thread (generation blocks it).

    The model's parameters are separate from `state` (a second copy, in the compute dtype), so writes
    into `state` take effect only through `update`, which copies the changed tensors into them.
    """

    def __init__(self, config: EngineConfig, *, version: int = 0) -> None:
        """Load the model folder (seconds for small models).

        Raises:
            ValueError: the model's parameter names are not the checkpoint's (updates could not reach them).
        """
        from transformers import AutoModelForCausalLM, GenerationConfig

        super().__init__(config, version=version)
        dtype = compute_dtype(config.dtype, on_cpu=config.device == "cpu")
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=DTYPES[dtype] or "auto", local_files_only=True)
        model.to(config.device).eval()  # type: ignore[arg-type]  # transformers' decorated `to` types its self oddly
        # Sample with our parameters only: the folder's generation defaults (top_k, penalties) would
        # make this engine sample differently from vLLM.
        model.generation_config = GenerationConfig(
            pad_token_id=self._pad_id(), bos_token_id=self.tokenizer.bos_token_id
        )
        self._model = model
        # `interrupt` ends a generation at the next module, prefill included (the stopping criteria below see it
        # between tokens only, and a prefill over long conversations takes tens of seconds on a busy CPU).
        self._breaker = Breaker(self._closing)
        self._breaker.attach(model, gradients=False)
        self._params = model.state_dict()  # name -> tensor sharing the parameter's storage (tied names included)
        missing = sorted(set(self.state) - set(self._params))
        if missing:
            raise ValueError(
                f"{config.model}: the transformers model has no parameter named {missing[:3]} (of "
                f"{len(missing)}): it renames checkpoint tensors, which this engine does not follow"
            )

    @property
    def adapter_support(self) -> str:
        return f"LoRA adapters up to rank {MAX_ADAPTER_RANK} (PEFT)"

    def _lora_support(self, lora: LoraSettings) -> tuple[str, str] | None:
        """PEFT serves any adapter up to `wire.lora.MAX_ADAPTER_RANK`."""
        if lora.r > MAX_ADAPTER_RANK:
            return (
                "rank above max",
                (
                    f"the run's adapter has rank {lora.r}, above the transformers engine's cap of "
                    f"{MAX_ADAPTER_RANK}: run the trainer with --lora-r {MAX_ADAPTER_RANK} or less, or --lora-sync "
                    "merged"
                ),
            )
        return None

    @torch.inference_mode(False)
    @torch.no_grad()
    def _serve_adapter(self, lora: LoraSettings | None) -> None:
        """See `Engine.serve_adapter`: PEFT wraps the model (no merge), or is taken off it (`unload`)."""
        from peft import PeftModel, get_peft_model

        base = delta.load_state(self.config.model)
        if isinstance(self._model, PeftModel):  # the plain modules back, no merge
            self._model = self._model.unload()
        params = self._model.state_dict()
        for name, tensor in base.items():
            params[name].copy_(tensor)
        # The base at version 0 from here: what the engine serves if wrapping fails below.
        self._state, self._params, self._version, self._lora = base, params, 0, None
        if lora is None:
            return
        model = get_peft_model(self._model, lora.peft_config()).eval().requires_grad_(False)
        adapter = {
            name.replace(f".{ADAPTER}.", "."): p.detach()
            for name, p in model.named_parameters()
            if ".lora_A." in name or ".lora_B." in name
        }
        self._model, self._params, self._lora = model, adapter, lora
        self._state = {name: p.to("cpu", torch.float32, copy=True) for name, p in sorted(adapter.items())}

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else next(iter(self.stop_token_ids), 0)  # padding is masked: any id works

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[Sampled]:
        pad = self._pad_id()
        width = max(len(p) for p in prompts)
        device = self.config.device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # left padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        greedy = params.temperature == 0
        stops = self._stops(params)
        gpus = [device] if device != "cpu" else []
        with torch.random.fork_rng(devices=gpus, enabled=params.seed is not None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            sampling: dict[str, Any] = (
                {} if greedy else {"temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
            )
            try:
                out = self._model.generate(  # type: ignore[misc]  # a causal LM's; transformers types its self narrowly
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=params.max_tokens,
                    eos_token_id=stops,
                    do_sample=not greedy,
                    return_dict_in_generate=True,
                    output_logits=True,
                    stopping_criteria=StoppingCriteriaList([_UntilSet(self._closing)]),
                    **sampling,
                    **self._stop_strings(params),
                )
            except Interrupted:  # closing: `generate` says so ("closed while generating")
                return [Sampled([], [], "length") for _ in prompts]
        assert not isinstance(out, torch.Tensor) and out.logits is not None  # return_dict_in_generate, output_logits
        new = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # raw logits: before temperature/top-p
        sampled = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        results = []
        for row, row_logprobs in zip(new.tolist(), sampled.tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
            n = end or len(row)
            results.append(Sampled(row[:n], row_logprobs[:n], "stop" if end else "length"))
        return results

    def _stop_strings(self, params: SamplingParams) -> dict[str, Any]:
        """`generate`'s arguments that end a row at a stop string (the base class cuts it exactly)."""
        return {"stop_strings": list(params.stop), "tokenizer": self.tokenizer} if params.stop else {}

    @torch.inference_mode()
    def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        pad = self._pad_id()
        width = max(len(p) for p in prompts)
        device = self.config.device
        ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts], device=device)  # right padded: causal
        mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=device)
        logits = self._model(input_ids=ids, attention_mask=mask).logits.float()
        scores = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return [row[: len(p) - 1] for row, p in zip(scores.tolist(), prompts, strict=True)]

    @torch.inference_mode()
    def _load(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        for name, tensor in changed.items():
            self._params[name].copy_(tensor)  # casts to the compute dtype; a tied lm_head shares this storage

    def _close(self) -> None:
        del self._model, self._params


class _UntilSet(StoppingCriteria):
    """Ends every sequence of a generation once `event` is set (the engine is closing)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)
