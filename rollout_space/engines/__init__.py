"""Inference engines with one interface: generate with the published state, take weight updates.

    >>> from rollout_space.engines import EngineConfig, SamplingParams, open_engine
    >>> engine = open_engine("transformers", EngineConfig("/path/to/model"))
    >>> [c] = engine.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0))
    >>> engine.update({"model.norm.weight": new_norm}, version=1)

`open_engine` imports a backend only when it is asked for (vLLM takes seconds to import).
"""

from __future__ import annotations

from typing import Any

import settings
from wire.rollout import Completion

from .base import Engine, EngineConfig, SamplingParams
from .errors import EngineError, PromptError, UpdateRefusedError

ENGINES = settings.ENGINES  # the names `open_engine` takes


def open_engine(kind: str, config: EngineConfig, *, version: int = 0, **options: Any) -> Engine:
    """Start an engine of `kind` (`transformers` or `vllm`) on `config.model`.

    Args:
        kind: Which backend.
        config: Model folder and compute settings.
        version: The version of the weights in the folder.
        options: Backend-specific keyword arguments (see `VLLMEngine.__init__`).

    Raises:
        ValueError: an unknown kind.
        ImportError: vLLM is not installed (with the package to install).
    """
    if kind == "transformers":
        from .transformers_engine import TransformersEngine

        return TransformersEngine(config, version=version, **options)
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(config, version=version, **options)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineError",
    "PromptError",
    "SamplingParams",
    "UpdateRefusedError",
    "open_engine",
]
