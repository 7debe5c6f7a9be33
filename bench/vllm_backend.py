"""The pause generation sees per version: vLLM updated through the `delta` backend vs the former path.

    python -m bench.vllm_backend [--models tiny smollm2] [--versions 10] [--lr 1e-5]

On the same deltas (sign steps of every weight at `--lr` in fp32, rounded to bf16: about what AdamW
does at an RL learning rate), in one run: each version is decoded while the engine serves, then
written and loaded with generation held off (`Engine.paused`, as the rollout follower does); that
hold is the pause. `former` is the engine as it was before the backend (its own worker extension
calling `reload_weights` through `collective_rpc`: bench/_vllm_legacy.py); `delta` is `VLLMEngine`
now (vLLM's weight-transfer API, backend `delta`). Both send the same whole fused groups. CPU only
unless vLLM for CUDA is installed (the CUDA path has not been measured).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

# Only light imports at the top: vLLM's workers import this __main__ module again (see bench/rollout.py).

ENGINES = ("former", "delta")


def _deltas(model: str, versions: int, lr: float) -> list[bytes]:
    import delta
    from bench.rollout import _updates

    state = delta.load_state(model)
    out = []
    for version in range(1, versions + 1):
        new = _updates(state, lr, seed=version)
        out.append(delta.diff(state, new, version=version, base_version=version - 1))
        state = new
    return out


def _pauses(kind: str, model: str, deltas: list[bytes]) -> list[float]:
    import delta
    from bench._vllm_legacy import LegacyVLLMEngine
    from rollout_space.engines import EngineConfig, SamplingParams
    from rollout_space.engines.vllm_engine import VLLMEngine

    cls = LegacyVLLMEngine if kind == "former" else VLLMEngine
    engine = cls(EngineConfig(model, max_model_len=512), kv_cache_bytes=64 << 20)
    try:
        engine.generate(["warm up"], SamplingParams(max_tokens=4))
        pauses = []
        for data in deltas:
            header, changes, digest = delta.decode(data, engine.state)  # while serving
            start = time.perf_counter()
            with engine.paused():
                result = delta.write_changes(header, changes, engine.state, digest)
                names = [e.name for e in result.header.tensors if e.changed]
                engine.update({n: engine.state[n] for n in names}, result.header.version)
            pauses.append(time.perf_counter() - start)
        engine.generate(["still serving"], SamplingParams(max_tokens=4))
        return pauses
    finally:
        engine.close()


def main() -> None:
    from bench.rollout import MODELS, _model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["tiny"])
    parser.add_argument("--versions", type=int, default=10, help="versions applied per engine")
    parser.add_argument("--lr", type=float, default=1e-5, help="step size of the synthetic updates")
    args = parser.parse_args()
    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; {args.versions} versions per engine, same deltas")
    print(f"{'model':<8} {'engine':<7} {'median ms':>10} {'mean ms':>8} {'max ms':>7} {'vs former':>10}")
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            folder = _model(name, root)
            deltas = _deltas(folder, args.versions, args.lr)
            medians = {}
            for kind in ENGINES:
                pauses = [p * 1e3 for p in _pauses(kind, folder, deltas)]
                medians[kind] = statistics.median(pauses)
                print(f"{name:<8} {kind:<7} {medians[kind]:>10.1f} {statistics.mean(pauses):>8.1f} "
                      f"{max(pauses):>7.1f} {medians[kind] / medians['former']:>9.2f}x", flush=True)


if __name__ == "__main__":
    main()
