"""Reproducible sequences of published checkpoints: the data every delta codec is measured on.

A run writes `DIR/step_0000.safetensors` (the initial state) .. `DIR/step_{K:04d}.safetensors` (after K
optimizer steps), all bf16 with HF parameter names, then `DIR/run.json` (parameters, model, per-step
density, timing). run.json is written last and is the commit: a folder holding one with the same
parameters is complete and is reused as is.

    python -m bench.checkpoints --data smollm2-bf16 --steps 4 --lr 1e-6 -o /work/data/smollm2-bf16

Data sets (`DATASETS`): real AdamW steps on next-token loss over real English text for SmolLM2-135M
(pretrained, weights on the GGUF 4-bit grid; or randomly initialised), trained in bf16 or with fp32
master weights, and for the tiny test Qwen3; the AdamW rule on synthetic gradients at Qwen3-0.6B's
shapes; and uniform synthetic deltas.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from delta.atomic import write_atomic

from ._files import step_file_name

RUN_FILE = "run.json"
RUN_FORMAT = "delta-sync-checkpoints"
#: Bump when a generator changes its output, so runs cached by an older version are redone.
GENERATOR_VERSION = 1
DEFAULT_UNIFORM_DENSITY = 0.01

#: Qwen3-0.6B's shapes (its config.json on the Hub), for the synthetic state of that size.
QWEN3_0_6B: dict[str, Any] = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class CheckpointParams:
    """What defines a run; equal parameters give the same bytes (same machine and library versions).

    Attributes:
        data: data set name, a key of `DATASETS`.
        steps: optimizer steps; the run holds steps + 1 states.
        lr: learning rate (RL runs use 1e-6 to 1e-5); unused by uniform-synthetic.
        seed: seed of initialisation, batch order and synthetic draws.
        density: fraction of elements changed per step, uniform-synthetic only (default 0.01).
    """

    data: str
    steps: int = 4
    lr: float = 1e-6
    seed: int = 0
    density: float | None = None

    def __post_init__(self) -> None:
        if self.data not in DATASETS:
            raise ValueError(f"unknown data set {self.data!r}; choose one of {', '.join(DATASETS)}")
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.density is not None and self.data != "uniform-synthetic":
            raise ValueError(f"density applies to uniform-synthetic only, not {self.data!r}; leave it unset")
        if self.density is not None and not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1], got {self.density}")


@dataclass(frozen=True)
class CheckpointRun:
    """A complete run on disk, as recorded in its run.json.

    Attributes:
        out_dir: the folder holding the step files and run.json.
        params: the parameters the run was made with.
        files: paths of the step files, index = step.
        elements: elements per state.
        changed: elements whose bits changed from step k-1 to step k, for k = 1..steps.
        seconds: time the generation took when it ran (not the time of a cache hit).
    """

    out_dir: str
    params: CheckpointParams
    files: list[str]
    elements: int
    changed: list[int]
    seconds: float

    @property
    def density(self) -> list[float]:
        """Fraction of elements changed per step, for steps 1..K."""
        return [c / self.elements for c in self.changed]


@dataclass(frozen=True)
class Dataset:
    """A named data set: a one-line description and the function that writes its step files."""

    description: str
    write: Callable[[str, CheckpointParams], dict[str, object]]


# The writers import transformers and the models when they run, so that reading a cached run stays instant.


def _smollm2(*, random_init: bool, fp32_master: bool) -> Callable[[str, CheckpointParams], dict[str, object]]:
    def write(out_dir: str, p: CheckpointParams) -> dict[str, object]:
        from models import prepare_smollm2

        from ._train import train_sequence

        model_dir = prepare_smollm2()
        facts = train_sequence(
            out_dir, model_dir, random_init=random_init, fp32_master=fp32_master,
            steps=p.steps, lr=p.lr, seed=p.seed, batch_size=8, seq_len=256,
        )  # fmt: skip
        return {"model": f"SmolLM2-135M-Instruct architecture ({os.path.basename(model_dir)})", **facts}

    return write


def _tiny_qwen3(out_dir: str, p: CheckpointParams) -> dict[str, object]:
    from models import build_tiny_qwen3

    from ._train import train_sequence

    with tempfile.TemporaryDirectory() as model_dir:
        build_tiny_qwen3(model_dir, seed=p.seed)
        facts = train_sequence(
            out_dir, model_dir, random_init=False, fp32_master=True,
            steps=p.steps, lr=p.lr, seed=p.seed, batch_size=4, seq_len=64,
        )  # fmt: skip
    return {"model": f"models.build_tiny_qwen3(seed={p.seed})", **facts}


def _qwen3_shape(out_dir: str, p: CheckpointParams) -> dict[str, object]:
    from transformers import Qwen3Config

    from ._synthetic import adam_sequence, parameter_shapes

    shapes = parameter_shapes(Qwen3Config(**QWEN3_0_6B))
    facts = adam_sequence(out_dir, shapes, steps=p.steps, lr=p.lr, seed=p.seed)
    return {"model": "Qwen3-0.6B shapes, random weights", **facts}


def _uniform(out_dir: str, p: CheckpointParams) -> dict[str, object]:
    from transformers import AutoConfig

    from models import prepare_smollm2

    from ._synthetic import parameter_shapes, uniform_sequence

    shapes = parameter_shapes(AutoConfig.from_pretrained(prepare_smollm2(), local_files_only=True))
    density = p.density if p.density is not None else DEFAULT_UNIFORM_DENSITY
    facts = uniform_sequence(out_dir, shapes, steps=p.steps, density=density, seed=p.seed)
    return {"model": "SmolLM2-135M shapes, random weights", **facts}


DATASETS: dict[str, Dataset] = {
    "smollm2-bf16": Dataset(
        "SmolLM2-135M-Instruct (weights on the GGUF 4-bit grid), AdamW directly in bf16",
        _smollm2(random_init=False, fp32_master=False),
    ),
    "smollm2-fp32master": Dataset(
        "SmolLM2-135M-Instruct, fp32 master weights, published as bf16",
        _smollm2(random_init=False, fp32_master=True),
    ),
    "random-bf16": Dataset(
        "SmolLM2-135M architecture randomly initialised (continuous weights), AdamW directly in bf16",
        _smollm2(random_init=True, fp32_master=False),
    ),
    "random-fp32master": Dataset(
        "SmolLM2-135M architecture randomly initialised, fp32 master weights, published as bf16",
        _smollm2(random_init=True, fp32_master=True),
    ),
    "tiny-qwen3": Dataset("the tiny test Qwen3, fp32 master weights, published as bf16 (fast)", _tiny_qwen3),
    "qwen3-0.6b-shape": Dataset(
        "Qwen3-0.6B shapes (596M elements): the AdamW rule on SYNTHETIC gradients, fp32 master, bf16 published",
        _qwen3_shape,
    ),
    "uniform-synthetic": Dataset(
        "SmolLM2-135M shapes: uniform random positions at a given density moved by ±1..3 ULPs", _uniform
    ),
}


def generate_checkpoints(params: CheckpointParams, out_dir: str) -> CheckpointRun:
    """Generate the run `params` describes into `out_dir`, or return it if `out_dir` already holds it.

    Step files are written to temporary names and renamed; run.json goes last. A folder with an
    older or different run has its run.json and step files replaced (other files are left alone).

    Args:
        params: data set and its parameters.
        out_dir: folder to fill; created if missing.

    Returns:
        The run, with the measured density of every step.
    """
    cached = load_run(out_dir)
    if cached is not None and cached.params == params:
        return cached
    os.makedirs(out_dir, exist_ok=True)
    _remove_run(out_dir)
    start = time.perf_counter()
    facts = DATASETS[params.data].write(out_dir, params)
    seconds = time.perf_counter() - start
    names = [step_file_name(k) for k in range(params.steps + 1)]
    elements, changed = measure_changes([os.path.join(out_dir, n) for n in names])
    record = {
        "format": RUN_FORMAT,
        "generator_version": GENERATOR_VERSION,
        "params": dataclasses.asdict(params),
        "description": DATASETS[params.data].description,
        **facts,
        "elements": elements,
        "steps": [
            {
                "step": k,
                "file": n,
                "bytes": os.path.getsize(os.path.join(out_dir, n)),
                **({"changed": changed[k - 1], "density": changed[k - 1] / elements} if k else {}),
            }
            for k, n in enumerate(names)
        ],
        "seconds": round(seconds, 2),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__},
    }
    write_atomic(os.path.join(out_dir, RUN_FILE), json.dumps(record, indent=2).encode())
    files = [os.path.join(out_dir, n) for n in names]
    return CheckpointRun(out_dir, params, files, elements, changed, round(seconds, 2))


def load_run(out_dir: str) -> CheckpointRun | None:
    """The complete run recorded in `out_dir`, or None if there is none (or it is stale or partial)."""
    path = os.path.join(out_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        record = json.load(f)
    if record.get("format") != RUN_FORMAT or record.get("generator_version") != GENERATOR_VERSION:
        return None
    files = [os.path.join(out_dir, s["file"]) for s in record["steps"]]
    if any(
        not os.path.isfile(f) or os.path.getsize(f) != s["bytes"] for f, s in zip(files, record["steps"], strict=True)
    ):
        return None
    return CheckpointRun(
        out_dir=out_dir,
        params=CheckpointParams(**record["params"]),
        files=files,
        elements=record["elements"],
        changed=[s["changed"] for s in record["steps"][1:]],
        seconds=record["seconds"],
    )


def measure_changes(files: list[str]) -> tuple[int, list[int]]:
    """Elements per state and, per consecutive pair of files, how many elements' bits differ.

    Compares integer views, so -0/+0 and NaN payloads count as the bits say. Reads one tensor at a time.
    """
    changed = []
    for old_path, new_path in tqdm(list(pairwise(files)), desc="Measuring density", unit="step"):
        with safe_open(old_path, "pt") as old, safe_open(new_path, "pt") as new:
            changed.append(sum(int((_bits(old.get_tensor(n)) != _bits(new.get_tensor(n))).sum()) for n in old.keys()))  # noqa: SIM118 - a safetensors file has keys() and no __iter__
    with safe_open(files[0], "pt") as first:
        elements = sum(math.prod(first.get_slice(n).get_shape()) for n in first.keys())  # noqa: SIM118 - a safetensors file has keys() and no __iter__
    return elements, changed


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _remove_run(out_dir: str) -> None:
    """Delete a previous run's record first (so it never looks complete), then its step files."""
    if os.path.exists(os.path.join(out_dir, RUN_FILE)):
        os.remove(os.path.join(out_dir, RUN_FILE))
    for name in os.listdir(out_dir):
        if name.startswith("step_") and name.endswith((".safetensors", ".safetensors.tmp")):
            os.remove(os.path.join(out_dir, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoints",
        description=__doc__.split("\n")[0],
        epilog="data sets:\n" + "\n".join(f"  {name}: {d.description}" for name, d in DATASETS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, choices=list(DATASETS), help="data set to generate")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate (default 1e-6)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument(
        "--density",
        type=float,
        help=f"uniform-synthetic only: changed fraction per step (default {DEFAULT_UNIFORM_DENSITY})",
    )
    parser.add_argument("-o", "--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        params = CheckpointParams(args.data, steps=args.steps, lr=args.lr, seed=args.seed, density=args.density)
    except ValueError as e:
        parser.error(str(e))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: this tool never needs the Hub
    run = generate_checkpoints(params, args.out)
    print(f"{params.data}: {run.elements:,} elements per state, generated in {run.seconds:.1f} s -> {run.out_dir}")
    for step, (changed, density) in enumerate(zip(run.changed, run.density, strict=True), start=1):
        print(f"  step {step}: {changed:>12,} changed  density {density:.4%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
