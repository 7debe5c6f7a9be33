"""Checkpoint sequences from real optimizer steps: torch AdamW on next-token loss over real English text.

This is what an RL trainer publishes, minus the reward: the update rule, learning rate and precision
are the trainer's, and the gradients come from a real language-model objective on real text.
"""

import hashlib
import os

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from models import english_text

from ._adamw import BETAS, EPS, WEIGHT_DECAY, adamw_record
from ._files import save_state, step_file_name

MAX_GRAD_NORM = 1.0  # TRL's default clipping


def train_sequence(
    out_dir: str,
    model_dir: str,
    *,
    random_init: bool,
    fp32_master: bool,
    steps: int,
    lr: float,
    seed: int,
    batch_size: int,
    seq_len: int,
) -> dict[str, object]:
    """Train `steps` AdamW steps and write the published bf16 state after each (step 0 = initial).

    Args:
        out_dir: existing folder that receives step_XXXX.safetensors.
        model_dir: HF model folder (config, tokenizer, and weights unless `random_init`).
        random_init: initialise the architecture from `seed` as transformers does, ignoring its weights.
        fp32_master: keep fp32 weights and optimizer state, compute in bf16 autocast, publish a bf16
            cast; otherwise weights, gradients and AdamW states are all bf16.
        steps, lr, seed: number of steps, learning rate, seed of the init and of the batch order.
        batch_size, seq_len: shape of each step's batch of token ids.

    Returns:
        Facts about the run for its JSON record: optimizer, batch shape, text hash, loss per step.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = _load_model(model_dir, random_init=random_init, fp32_master=fp32_master, seed=seed)
    batches = _batches(tokenizer, steps=steps, batch_size=batch_size, seq_len=seq_len, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    model.train()
    save_state(_published(model), os.path.join(out_dir, step_file_name(0)))
    losses = []
    for step, batch in enumerate(tqdm(batches, desc="AdamW steps", unit="step"), start=1):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp32_master):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        save_state(_published(model), os.path.join(out_dir, step_file_name(step)))
    return {
        "init": f"transformers' random init (seed {seed}) rounded to bf16" if random_init else "the folder's weights",
        "weights": "fp32 master, bf16 autocast, published as bf16" if fp32_master else "bf16 (AdamW states bf16)",
        "optimizer": {"name": "torch.optim.AdamW", **adamw_record(), "max_grad_norm": MAX_GRAD_NORM},
        "objective": "next-token cross-entropy on pydoc_data.topics (the Python language reference)",
        "text_sha256": hashlib.sha256(english_text().encode("utf-8")).hexdigest(),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "losses": losses,
        "torch_threads": torch.get_num_threads(),
    }


def _load_model(model_dir: str, *, random_init: bool, fp32_master: bool, seed: int) -> PreTrainedModel:
    """The model in its training dtype, starting from bf16 values as when a bf16 checkpoint is loaded.

    A random init is transformers' (normal, std 0.02; norms 1.0) rounded to bf16; it leaves the
    global RNG untouched.
    """
    dtype = torch.float32 if fp32_master else torch.bfloat16
    if not random_init:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(torch.bfloat16).to(dtype)


def _batches(
    tokenizer: PreTrainedTokenizerBase, *, steps: int, batch_size: int, seq_len: int, seed: int
) -> list[torch.Tensor]:
    """One (batch_size, seq_len) block of the tokenised text per step, blocks in a seeded order."""
    ids = torch.tensor(tokenizer(english_text(), add_special_tokens=False, verbose=False)["input_ids"])
    block = batch_size * seq_len
    count = len(ids) // block
    if count == 0:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one batch of {batch_size}x{seq_len}")
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return [ids[order[i % count] * block :][:block].view(batch_size, seq_len) for i in range(steps)]


def _published(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The bf16 state a trainer publishes: every parameter once (a tied lm_head is the embedding)."""
    return {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
