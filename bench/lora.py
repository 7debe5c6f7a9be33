"""What each LoRA sync mode costs: bytes, changed fraction, publish -> serving time, generation speed.

    python -m bench.lora [--model smollm2|FOLDER] [--steps 10] [--rank 16] [--lr 1e-4] [--engine transformers|vllm]
                         [--json out.json]

One run trains a LoRA adapter (PEFT with the trainer's `LoraSettings.peft_config`: every attention and MLP
projection, alpha 2r) for `--steps` real AdamW steps of next-token loss on a fixed batch of English text, and after
each step publishes both states the trainer can publish (`trainer_space.lora`) through a real `delta.Publisher`
into a local-folder bucket of its own, each followed by an engine (`rollout_space.follower.Follower`):

- adapter mode: the adapter's tensors in float32, served under PEFT unmerged;
- merged mode: the base with the adapter merged in, in the checkpoint's dtype (bf16), served as plain weights.

Printed per version, beside the baselines of the same run: the delta's bytes in each mode against the whole
adapter file and the full model file (what a sync without deltas sends), the fraction of elements whose bits
changed, and the time from `publish` to the engine serving the version (the two modes one after the other, nothing
generating; the followers poll as a rollout server does unless `--poll-interval` says otherwise). Then greedy
generation tokens per second (of wall time, and of this process's CPU time, steadier on a shared machine) of the
final adapter served as LoRA against the same policy merged. About 6 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

# Only light imports at the top: vLLM's workers start by importing this __main__ module again (see bench.rollout).

MODES = ("adapter", "merged")
PROMPTS = [
    "Let's play Wordle. Make your first guess.",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
]


@dataclass
class Version:
    """One published version in both modes: bytes in the bucket, changed fraction, publish -> serving seconds."""

    version: int
    loss: float
    delta_bytes: dict[str, int]
    changed: dict[str, float]
    serve_s: dict[str, float]


def _model(name: str) -> str:
    """The model folder: the offline SmolLM2-135M-Instruct (`models.prepare_smollm2`), or a local folder."""
    from models import prepare_smollm2

    return prepare_smollm2() if name == "smollm2" else name


def _file_bytes(state: dict) -> int:
    """Size of `state` as one safetensors file (what a sync that sends whole files moves per version)."""
    from safetensors.torch import save

    return len(save({n: t.contiguous() for n, t in state.items()}))


def _changed(old: dict, new: dict) -> float:
    """Fraction of elements whose bits differ between two states of the same tensors."""
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    moved = sum(
        int((t.view(width[t.element_size()]) != old[n].view(width[t.element_size()])).sum()) for n, t in new.items()
    )
    return moved / sum(t.numel() for t in new.values())


def _warm_up() -> None:
    """Run the codec once per dtype and density (its kernels compile on first use), so no timed publish pays it."""
    import torch

    import delta

    for dtype in (torch.bfloat16, torch.float32):
        for every in (1, 7):
            old = torch.randn(1 << 16).to(dtype)
            new = old.clone()
            new[::every] += 1
            delta.apply({"w": old}, delta.diff({"w": old.clone()}, {"w": new}))


def _serving(engine, version: int, timeout: float = 600.0) -> None:
    """Wait until `engine` serves `version`."""
    deadline = time.monotonic() + timeout
    while engine.version < version:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine did not reach version {version} in {timeout:g} s")
        time.sleep(0.002)


def _tokens_per_s(engines: dict, max_tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    """Best greedy generation rate of each engine over `rounds` batches of `PROMPTS`, the engines taking turns (so
    that drift in the machine's load hits each alike): per second of wall time, and per second of this process's
    CPU time (which other processes on a shared machine disturb far less)."""
    from rollout_space.engines import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    best = {mode: {"wall": 0.0, "cpu": 0.0} for mode in engines}
    for _ in range(rounds):
        for mode, engine in engines.items():
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sum(len(c.token_ids) for c in engine.generate(PROMPTS, params))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[mode]["wall"] = max(best[mode]["wall"], tokens / wall)
            best[mode]["cpu"] = max(best[mode]["cpu"], tokens / cpu)
    return best


def _vllm_skip(kind: str) -> str | None:
    """Why the `kind` engine cannot serve an adapter on this machine (None: it can)."""
    if kind != "vllm":
        return None
    import importlib.util

    return "vLLM is not installed" if importlib.util.find_spec("vllm") is None else None


def _engine_options(kind: str, rank: int) -> dict:
    """vLLM serves adapters up to the rank it starts with, one of the ranks it allows."""
    if kind != "vllm":
        return {}
    from settings import VLLM_LORA_RANKS

    return {"max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank)}


def run(
    model: str,
    *,
    steps: int,
    rank: int,
    lr: float,
    engine_kind: str,
    batch: int,
    seq_len: int,
    gen_tokens: int,
    poll_interval: float,
) -> dict:
    """Train, publish and follow as the module docstring says; returns the figures (see `main` for the printout)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import delta
    from bench._adamw import BETAS, EPS, WEIGHT_DECAY
    from bench._train import _batches
    from rollout_space.engines import EngineConfig, open_engine
    from rollout_space.follower import Follower
    from trainer_space.lora import adapter_tensors, lora_master
    from trainer_space.weights import checkpoint_dtypes
    from wire.lora import DEFAULT_TARGETS, LoraSettings

    torch.manual_seed(0)
    base_state = delta.load_state(model)
    settings = {
        mode: LoraSettings(
            sync=mode,
            r=rank,
            alpha=2.0 * rank,
            targets=DEFAULT_TARGETS,
            base_model=model,
            base_hash=delta.state_digest(base_state).hexdigest,
        )
        for mode in MODES
    }
    policy = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, local_files_only=True),
        settings["adapter"].peft_config(),
    )
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    [ids] = _batches(
        AutoTokenizer.from_pretrained(model, local_files_only=True), steps=1, batch_size=batch, seq_len=seq_len, seed=0
    )
    dtypes = checkpoint_dtypes(model)

    def published(mode: str) -> dict[str, torch.Tensor]:
        master = lora_master(policy, model, mode)
        return {n: master[n].to(torch.float32 if mode == "adapter" else dtypes[n], copy=True) for n in master}

    states = {mode: published(mode) for mode in MODES}
    figures: dict = {
        "adapter_file_bytes": _file_bytes(states["adapter"]),
        "model_file_bytes": _file_bytes(base_state),
        "adapter_params": sum(t.numel() for t in adapter_tensors(policy).values()),
        "model_params": sum(t.numel() for t in base_state.values()),
    }
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as root:
        buckets = {mode: os.path.join(root, mode) for mode in MODES}
        publishers = {mode: delta.Publisher(buckets[mode]) for mode in MODES}
        for mode in MODES:
            publishers[mode].publish(states[mode])  # version 1: the base, and PEFT's initial adapter (B = 0)
            publishers[mode].flush()
        engines, followers, versions = {}, {}, []
        try:
            for mode in MODES:
                engines[mode] = open_engine(
                    engine_kind, EngineConfig(model, max_model_len=512), **_engine_options(engine_kind, rank)
                )
                followers[mode] = Follower(
                    engines[mode], buckets[mode], delta.SubscriberConfig(poll_interval=poll_interval)
                )
                followers[mode].adopt(settings[mode])
                followers[mode].sync()
                followers[mode].start()
            _warm_up()
            for version in range(2, steps + 2):
                policy.train()
                loss = policy(input_ids=ids, labels=ids).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                record = Version(version, loss.item(), {}, {}, {})
                for mode in MODES:
                    state = published(mode)
                    record.changed[mode] = _changed(states[mode], state)
                    states[mode] = state
                    start = time.perf_counter()
                    publishers[mode].publish(state)
                    _serving(engines[mode], version)
                    record.serve_s[mode] = time.perf_counter() - start
                versions.append(record)
            for mode in MODES:
                publishers[mode].close()
                manifest = delta.read_manifest(buckets[mode])
                assert manifest is not None  # published above
                entries = manifest.versions
                for record, entry in zip(versions, entries[1:], strict=True):
                    record.delta_bytes[mode] = sum(f.size for f in entry.delta)
            for follower in followers.values():  # generation measured with nothing polling beside it
                follower.close()
            figures["tokens_per_s"] = _tokens_per_s(engines, gen_tokens, rounds=5)
        finally:
            for mode in MODES:
                publishers[mode].close()
                if mode in followers:
                    followers[mode].close()
                if mode in engines:
                    engines[mode].close()
    figures["versions"] = [asdict(v) for v in versions]
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (offline SmolLM2-135M-Instruct) or a model folder")
    parser.add_argument("--steps", type=int, default=10, help="AdamW steps, one published version each")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank r (alpha 2r)")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate of the adapter")
    parser.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        default="transformers",
        help="the engine that follows each bucket and generates",
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences in the fixed training batch")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--gen-tokens", type=int, default=32, help="greedy tokens per prompt for tokens/s")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between the followers' bucket polls (default: the rollout server's)",
    )
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    import torch

    from delta import Budget

    poll = Budget.of("a-folder").poll_s if args.poll_interval is None else args.poll_interval  # a folder bucket
    ran_on = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), python {platform.python_version()}; load from other processes "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"measured on: {ran_on}")
    skip = _vllm_skip(args.engine)
    if skip:
        print(f"--engine vllm: skipped, {skip}")
        return {"skipped": skip}
    model = _model(args.model)
    print(
        f"model {model}; LoRA r={args.rank} alpha={2 * args.rank} on every attention and MLP projection; "
        f"{args.steps} AdamW steps at lr {args.lr:g} on one fixed batch of {args.batch}x{args.seq_len} tokens; "
        f"engine {args.engine}, bucket polled every {poll:g} s"
    )
    figures = run(
        model,
        steps=args.steps,
        rank=args.rank,
        lr=args.lr,
        engine_kind=args.engine,
        batch=args.batch,
        seq_len=args.seq_len,
        gen_tokens=args.gen_tokens,
        poll_interval=poll,
    )
    adapter_file, model_file = figures["adapter_file_bytes"], figures["model_file_bytes"]
    print(
        f"baselines: whole adapter file (fp32) {adapter_file:,} B ({figures['adapter_params']:,} parameters, "
        f"{figures['adapter_params'] / figures['model_params']:.2%} of the model's); full model file (bf16) "
        f"{model_file:,} B"
    )
    print(
        f"{'version':>7} {'loss':>7} {'adapter delta B':>15} {'/file':>6} {'changed':>8} {'serve s':>8} "
        f"{'merged delta B':>15} {'/file':>6} {'changed':>8} {'serve s':>8}"
    )
    for v in figures["versions"]:
        cells = [
            f"{v['delta_bytes'][m]:>15,} {v['delta_bytes'][m] / f:>6.1%} {v['changed'][m]:>8.2%} "
            f"{v['serve_s'][m]:>8.2f}"
            for m, f in (("adapter", adapter_file), ("merged", model_file))
        ]
        print(f"{v['version']:>7} {v['loss']:>7.3f} {cells[0]} {cells[1]}")
    for mode, whole in (("adapter", adapter_file), ("merged", model_file)):
        rows = figures["versions"]
        print(
            f"{mode}: median delta {statistics.median(v['delta_bytes'][mode] for v in rows):,.0f} B "
            f"(whole file {whole:,} B), changed {statistics.median(v['changed'][mode] for v in rows):.2%}, "
            f"publish -> serving {statistics.median(v['serve_s'][mode] for v in rows):.2f} s (median)"
        )
    tps = figures["tokens_per_s"]
    served = "vLLM, one LoRARequest per version" if args.engine == "vllm" else "PEFT, unmerged"
    # vLLM generates in its engine process: this process's CPU time would leave that out.
    for unit, per in (("wall", "s"), ("cpu", "CPU s"))[: 1 if args.engine == "vllm" else 2]:
        print(
            f"generation ({len(PROMPTS)} prompts, greedy, up to {args.gen_tokens} tokens, best of 5, taking turns), "
            f"tokens per {per}: adapter served as LoRA ({served}) {tps['adapter'][unit]:.1f}; merged "
            f"{tps['merged'][unit]:.1f} ({tps['adapter'][unit] / tps['merged'][unit]:.2f}x)"
        )
    figures.update(
        command=" ".join(["python -m bench.lora", *(sys.argv[1:] if argv is None else argv)]),
        measured_on=ran_on,
        model=model,
        steps=args.steps,
        rank=args.rank,
        lr=args.lr,
        engine=args.engine,
        poll_interval=poll,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return figures


if __name__ == "__main__":
    main()
