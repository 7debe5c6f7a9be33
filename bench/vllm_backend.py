"""The pause generation sees per version: vLLM updated through the `delta` backend, in process and served.

    python -m bench.vllm_backend [--models tiny smollm2] [--versions 8] [--lr 1e-5] [--no-serve]

On the same states (sign steps of every weight at `--lr` in fp32, rounded to bf16: about what AdamW
does at an RL learning rate), in one run:

- `delta`: `VLLMEngine` (vLLM's weight-transfer API, backend `delta`): each version is decoded while the engine
  serves, then written and loaded with generation held off (`Engine.paused`, as the rollout follower does): that
  hold is the pause;
- `serve`: a real `vllm serve` with the backend, followed by `delta follow` (`ServerFollower`) over
  HTTP; the pause is from `/pause` to `/resume` returning (the versions go through a local bucket).

All send the same whole fused groups. CPU only unless vLLM for CUDA is installed (the CUDA path has
not been measured).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from itertools import pairwise

# Only light imports at the top: vLLM's workers import this __main__ module again (see bench/rollout.py).


def _states(model: str, versions: int, lr: float) -> list[dict]:
    """The model's state, then `versions` successive sign steps of it."""
    import delta
    from bench.rollout import _updates

    states = [delta.load_state(model)]
    for version in range(1, versions + 1):
        states.append(_updates(states[-1], lr, seed=version))
    return states


def _pauses(model: str, states: list[dict]) -> list[float]:
    import delta
    from rollout_space.engines import EngineConfig, SamplingParams
    from rollout_space.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(EngineConfig(model, max_model_len=512), kv_cache_bytes=64 << 20)
    try:
        engine.generate(["warm up"], SamplingParams(max_tokens=4))
        pauses = []
        for version, (old, new) in enumerate(pairwise(states), start=1):
            data = delta.diff(old, new, version=version, base_version=version - 1)
            header, changes, digest = delta.decode(data, engine.state)  # while serving
            start = time.perf_counter()
            with engine.paused():
                result = delta.write_changes(header, changes, engine.state, digest)
                names = [e.name for e in result.header.tensors if e.changed]
                assert result.header.version is not None  # delta.diff was given one
                engine.update({n: engine.state[n] for n in names}, result.header.version)
            pauses.append(time.perf_counter() - start)
        engine.generate(["still serving"], SamplingParams(max_tokens=4))
        return pauses
    finally:
        engine.close()


def _serve_pauses(model: str, states: list[dict], root: str) -> list[float]:
    """Pauses of a `vllm serve` followed by `ServerFollower`: version 1 is `states[0]` (sent whole at start),
    then one version per later state, each published once the previous one is served."""
    import threading
    from pathlib import Path

    import delta
    from bench._vllm_serve import VLLMServer
    from delta.follow import FollowConfig, ServerFollower

    bucket = tempfile.mkdtemp(prefix="serve-bucket-", dir=root)  # one per model
    server = VLLMServer(model, Path(root) / "serve.log", max_model_len=512).wait_ready()
    try:
        with delta.Publisher(bucket, delta.PublisherConfig(anchor_every=10_000)) as publisher:
            publisher.publish(states[0])
            publisher.flush()
            follower = ServerFollower(
                FollowConfig(bucket, server.url, poll_interval=0.05, history=len(states)), log=lambda line: None
            )
            runner = threading.Thread(target=follower.run, kwargs={"until": len(states)}, daemon=True)
            runner.start()
            for version, state in enumerate(states[1:], start=2):
                while follower.status.version != version - 1:
                    time.sleep(0.02)
                publisher.publish(state)
                publisher.flush()
            runner.join(600)
            follower.close()
        applied = [a for a in follower.status.applied if a["via"] == "delta"]
        if len(applied) != len(states) - 1 or follower.status.failures:
            raise RuntimeError(
                f"the follower applied {len(applied)} of {len(states) - 1} versions as deltas, "
                f"{follower.status.failures} failures: {follower.status.last_error}"
            )
        return [a["pause_s"] for a in applied]
    finally:
        server.stop()


def main() -> None:
    from bench.rollout import MODELS, _model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["tiny"])
    parser.add_argument("--versions", type=int, default=8, help="versions applied per engine")
    parser.add_argument("--lr", type=float, default=1e-5, help="step size of the synthetic updates")
    parser.add_argument("--no-serve", action="store_true", help="leave out the `vllm serve` + `delta follow` row")
    args = parser.parse_args()
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; {args.versions} versions per row, same states"
    )
    print(f"{'model':<8} {'path':<7} {'median ms':>10} {'mean ms':>8} {'max ms':>7}")
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            folder = _model(name, root)
            states = _states(folder, args.versions, args.lr)
            for kind in ("delta",) + (() if args.no_serve else ("serve",)):
                pauses = _serve_pauses(folder, states, root) if kind == "serve" else _pauses(folder, states)
                pauses = [p * 1e3 for p in pauses]
                print(
                    f"{name:<8} {kind:<7} {statistics.median(pauses):>10.1f} {statistics.mean(pauses):>8.1f} "
                    f"{max(pauses):>7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
