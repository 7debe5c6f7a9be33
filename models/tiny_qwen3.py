"""A tiny random Qwen3 with a locally trained byte-level BPE tokenizer: a real HF model folder in seconds.

Tests and fast examples need a model that transformers (and later vLLM) load like any Hub model, without
a download. The architecture is Qwen3's, the sizes are toy sizes, the weights are random.
"""

import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ._corpus import english_text

BOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [BOS_TOKEN, "<|im_start|>", "<|im_end|>"]

#: ChatML, as Qwen3 uses it (without the thinking markup), so chat prompts work with apply_chat_template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Characters of the corpus the tokenizer is trained on: enough for useful merges, well under a second.
TOKENIZER_TRAINING_CHARS = 100_000


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer in-process on the stdlib's English text.

    Byte level means every string round-trips (no unknown tokens), like the tokenizers of real
    LLMs. Training is deterministic: same text and vocab size give the same tokenizer.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = english_text()[:TOKENIZER_TRAINING_CHARS]
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token="<|im_end|>",
        pad_token=BOS_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_qwen3(
    path: str,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    vocab_size: int = 1024,
) -> str:
    """Write a tiny random Qwen3 (bf16 safetensors, tied embeddings) and its tokenizer to `path`.

    Weights are initialised as transformers does (normal, std 0.02; norms 1.0) from `seed`, so the
    same arguments give the same files. No network access.

    Args:
        path: folder to write; created if missing, existing model files in it are overwritten.
        seed: seed of the weight initialisation.
        hidden_size: model width; heads are 16 wide, key/value heads half the query heads.
        num_hidden_layers: number of decoder layers.
        vocab_size: BPE vocabulary size, special tokens included.

    Returns:
        `path`, ready for `from_pretrained(path)`.
    """
    if hidden_size % 32 != 0:
        raise ValueError(f"hidden_size must be a multiple of 32 (heads of 16, GQA 2:1), got {hidden_size}")
    tokenizer = build_tokenizer(vocab_size)
    num_heads = hidden_size // 16
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads // 2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' decorated `to` types its first argument as the model
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
