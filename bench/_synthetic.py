"""Synthetic checkpoint sequences, generated tensor by tensor so any model size fits in memory.

- `adam_sequence`: the AdamW update rule applied to fp32 master weights with synthetic gradients
  (a fixed-seed standard normal per tensor and step), published as bf16. It is how a state of
  Qwen3-0.6B's size is produced on a machine that cannot train one: the update rule is real, the
  gradients are not (they are independent between steps and carry no structure across elements).
- `uniform_sequence`: random positions at a fixed density, each moved by 1 to MAX_ULPS ULPs up or
  down. The easy, unrealistic case: positions and values independent of the weights.
"""

import hashlib
import os
from collections.abc import Callable, Mapping
from contextlib import ExitStack

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PretrainedConfig

from ._adamw import BETAS, EPS, WEIGHT_DECAY, adamw_record
from ._files import StreamingWriter, step_file_name

INIT_STD = 0.02  # transformers' initializer_range for Qwen3 and Llama
MAX_ULPS = 3
_MAX_FINITE_BF16_MAGNITUDE = 0x7F7F

Shapes = Mapping[str, tuple[int, ...]]
Emit = Callable[[int, torch.Tensor], None]


def parameter_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a model's parameters (tied ones once), without allocating any weight."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def adam_sequence(out_dir: str, shapes: Shapes, *, steps: int, lr: float, seed: int) -> dict[str, object]:
    """Write steps 0..`steps` of AdamW on synthetic gradients into `out_dir`, one tensor at a time.

    Per step: m, v updated as torch's AdamW does, w <- w*(1 - lr*wd) - lr*m_hat/(sqrt(v_hat)+eps);
    the first step therefore moves every weight by lr*sign(g). Memory: about five fp32 copies of
    the largest tensor.
    """
    b1, b2 = BETAS

    def evolve(name: str, w: torch.Tensor, emit: Emit) -> None:
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        for step in range(1, steps + 1):
            g = torch.randn(w.shape, generator=_generator(seed, name, step))
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            del g
            w.mul_(1 - lr * WEIGHT_DECAY)
            denom = v.sqrt().div_((1 - b2**step) ** 0.5).add_(EPS)
            w.addcdiv_(m, denom, value=-lr / (1 - b1**step))
            del denom
            emit(step, w)

    _stream(out_dir, shapes, steps, seed, evolve, desc="AdamW rule, synthetic gradients")
    return {
        "rule": "AdamW update on fp32 master weights, published as bf16",
        "gradients": "synthetic: standard normal, fixed seed per tensor and step (not a real objective)",
        "init": f"normal(0, {INIT_STD}) for matrices and embeddings, 1.0 for norms, rounded to bf16",
        "optimizer": {"name": "AdamW rule, as torch.optim.AdamW computes it", **adamw_record()},
    }


def uniform_sequence(out_dir: str, shapes: Shapes, *, steps: int, density: float, seed: int) -> dict[str, object]:
    """Write steps 0..`steps` where each step moves a uniform random `density` of elements by ±1..MAX_ULPS ULPs.

    The sign bit is kept; magnitudes are clamped to finite values, so nothing becomes inf or NaN.
    """

    def evolve(name: str, w: torch.Tensor, emit: Emit) -> None:
        bits = w.to(torch.bfloat16).view(torch.int16).view(-1)  # exact: w holds bf16 values
        for step in range(1, steps + 1):
            generator = _generator(seed, name, step)
            where = torch.nonzero(torch.rand(bits.numel(), generator=generator) < density).squeeze(1)
            ulps = torch.randint(1, MAX_ULPS + 1, (len(where),), generator=generator, dtype=torch.int32)
            ulps *= torch.randint(0, 2, (len(where),), generator=generator, dtype=torch.int32) * 2 - 1
            old = bits[where].to(torch.int32) & 0xFFFF
            new = (old & 0x8000) | ((old & 0x7FFF) + ulps).clamp_(0, _MAX_FINITE_BF16_MAGNITUDE)
            bits[where] = torch.where(new >= 0x8000, new - 0x10000, new).to(torch.int16)
            emit(step, bits.view(torch.bfloat16).view(w.shape))

    _stream(out_dir, shapes, steps, seed, evolve, desc="uniform synthetic deltas")
    return {
        "rule": f"uniform random positions at density {density}, each moved by ±1..{MAX_ULPS} ULPs",
        "init": f"normal(0, {INIT_STD}) for matrices and embeddings, 1.0 for norms, rounded to bf16",
    }


def _stream(
    out_dir: str, shapes: Shapes, steps: int, seed: int, evolve: Callable[[str, torch.Tensor, Emit], None], desc: str
) -> None:
    """Open one streaming file per step, then per tensor: initialise, publish it as step 0, `evolve` it.

    `evolve(name, w, emit)` calls `emit(step, tensor)` for steps 1..`steps` in order.
    """
    total = sum(int(torch.Size(shape).numel()) for shape in shapes.values())
    with ExitStack() as stack:
        writers = [
            stack.enter_context(StreamingWriter(os.path.join(out_dir, step_file_name(k)), shapes, torch.bfloat16))
            for k in range(steps + 1)
        ]
        with tqdm(total=total, desc=desc, unit="el", unit_scale=True) as bar:
            for name, shape in shapes.items():

                def emit(step: int, tensor: torch.Tensor, name: str = name) -> None:
                    writers[step].write(name, tensor.to(torch.bfloat16))

                w = _init(name, shape, seed)
                emit(0, w)
                evolve(name, w, emit)
                del w
                bar.update(int(torch.Size(shape).numel()))


def _init(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Initial weight as a bf16 checkpoint holds it (transformers' init rounded to bf16), in fp32.

    Norms are 1.0, everything else normal(0, 0.02). Starting from bf16 values is what a trainer does
    when it loads a published bf16 checkpoint into fp32 master weights.
    """
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    return torch.randn(shape, generator=_generator(seed, name, 0)).mul_(INIT_STD).bfloat16().float()


def _generator(seed: int, name: str, step: int, device: str = "cpu") -> torch.Generator:
    """A generator on `device` seeded from (seed, tensor name, step): the draws do not depend on tensor order (a
    GPU's generator draws other numbers than the CPU's from the same seed)."""
    digest = hashlib.sha256(f"{seed}/{name}/{step}".encode()).digest()
    return torch.Generator(device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)
