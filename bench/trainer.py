"""What publishing costs the trainer, and a bounded real training run.

    python -m bench.trainer overhead [--model PATH] [--steps 6] [--warmup 1] [--games 4]
    python -m bench.trainer run [--minutes 12] [--png docs/training.png]

`overhead`: GRPO step time with a delta published after every step, and without.

Runs the trainer Space's own `TrainingSession` (TRL's GRPOTrainer, the publish callback, a local bucket)
twice, publishing off then on, on the same fixed batch of games: the rollouts are replayed from a
synthetic batch (prompt and completion token ids of Wordle-game length, rewards that differ within each
group) so that both runs do the same training work and the difference is publishing alone — the
snapshot copy on the step's path and the background encode and upload competing for the same cores.
A real step also waits for the rollout Space, so the ratio here is the worst case. Prints the machine,
the median step time of each run after `--warmup` steps, and the ratio (goal: publishing <= 5 %), in
wall time and in process CPU time (steadier on a shared machine; it counts the publisher's background
work in full, as if no core were spare).

`run`: env, rollout (transformers engine) and trainer as three `python app.py ROLE` processes on a fresh
local bucket with SmolLM2-135M-Instruct, for `--minutes`; then the trainer's `/history` is saved to
bench/out/training.json and drawn (reward and win rate per step; bytes per version: the default codec,
`raw`, the dense model) to `--png`.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time

import torch

from trainer_space import TrainerConfig, TrainingSession


class ReplayedGames:
    """Stands in for the rollout Space's client in this benchmark: the same games every step."""

    def __init__(self, vocab: int, prompt_len: int, completion_len: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab, self.prompt_len, self.completion_len = vocab, prompt_len, completion_len
        self.batch: dict[int, dict] = {}

    def rollout(self, games: list[dict], **_: object) -> list[dict]:
        out = []
        for i, g in enumerate(games):
            if i not in self.batch:
                r = self.rng
                mask = [1 if (t // 30) % 2 == 0 else 0 for t in range(self.completion_len)]  # model/env turns
                self.batch[i] = {
                    "prompt_ids": [r.randrange(self.vocab) for _ in range(self.prompt_len)],
                    "completion_ids": [r.randrange(self.vocab) for _ in range(self.completion_len)],
                    "logprobs": [-1.0] * self.completion_len, "env_mask": mask,
                    "reward": r.uniform(-1, 1), "won": False, "version": 0, "secret": "crane",
                    "guesses": [], "marks": [],
                }
            out.append(self.batch[i])
        return out


def run(model: str, publish: bool, steps: int, games: int, lr: float) -> TrainingSession:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    bucket = tempfile.mkdtemp(prefix="bench-trainer-")
    config = TrainerConfig(bucket=bucket, rollout_url="http://replayed", model=model, games_per_step=games,
                           num_generations=4, max_steps=steps, learning_rate=lr, publish=publish,
                           max_staleness=10**9, output_dir=os.path.join(bucket, "out"))
    session = TrainingSession(config, client=ReplayedGames(vocab, prompt_len=120, completion_len=120))
    session.start()
    session.wait()
    if session.error:
        raise RuntimeError(session.error)
    session.close()
    return session


def overhead(args: argparse.Namespace) -> None:
    from models import resolve_model

    model = resolve_model(args.model)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads; load avg {os.getloadavg()[0]:.1f}")
    print(f"model: {model}; {args.games} games x (120 prompt + 120 completion tokens) per step, lr {args.lr}")
    results, cpu_times = {}, {}
    for publish in (False, True):
        session = run(model, publish, args.steps, args.games, args.lr)
        times = [r.step_s for r in session.records][args.warmup:]
        cpu = statistics.median([r.cpu_s for r in session.records][args.warmup:])
        cpu_times[publish] = cpu
        copy = [r.publish_s for r in session.records][args.warmup:]
        results[publish] = statistics.median(times)
        label = "publishing on " if publish else "publishing off"
        extra = ""
        if publish and session.payloads is not None:
            time.sleep(1.5)
            session.payloads.poll()
            sizes = [p.delta_bytes for p in session.payloads.records]
            extra = (f"; publish() blocked {1000 * statistics.median(copy):.0f} ms; delta {statistics.median(sizes):,.0f}"
                     f" B/step vs dense {session.payloads.dense_bytes:,} B" if sizes else "")
        print(f"{label}: median step {results[publish]:.2f} s wall, {cpu:.2f} s CPU, over {len(times)} steps "
              f"(all: {', '.join(f'{t:.2f}' for t in times)}){extra}")
    ratio = results[True] / results[False]
    print(f"ratio on/off, wall: {ratio:.3f} (publishing costs {100 * (ratio - 1):+.1f} % of a step; goal <= 5 %)")
    ratio = cpu_times[True] / cpu_times[False]
    print(f"ratio on/off, CPU:  {ratio:.3f} ({100 * (ratio - 1):+.1f} %)")


def real_run(args: argparse.Namespace) -> None:
    import json
    import subprocess
    import sys

    import httpx

    from models import resolve_model

    model = resolve_model(args.model)
    root = tempfile.mkdtemp(prefix="training-run-")
    bucket = os.path.join(root, "bucket")
    ports = {"env": 7871, "rollout": 7872, "trainer": 7873}
    url = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    roles = {
        "env": [],
        "rollout": ["--bucket", bucket, "--model", model, "--env-url", url["env"], "--engine", "transformers",
                    "--showcase-every", "0"],
        "trainer": ["--bucket", bucket, "--model", model, "--rollout-url", url["rollout"], "--env-url", url["env"],
                    "--games-per-step", str(args.games), "--num-generations", "4", "--max-tokens", "24",
                    "--max-turns", str(args.max_turns), "--learning-rate", str(args.lr), "--max-steps", "100000"],
    }
    procs = []
    logs = open(os.path.join(root, "roles.log"), "w")
    try:
        for name, flags in roles.items():
            procs.append(subprocess.Popen([sys.executable, "app.py", name, *flags, "--port", str(ports[name])],
                                          stdout=logs, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(f"{url[name]}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or procs[-1].poll() is not None:
                    raise RuntimeError(f"{name} did not start; see {logs.name}")
                time.sleep(1)
        start = time.monotonic()
        while time.monotonic() - start < 60 * args.minutes:
            time.sleep(10)
            status = httpx.get(f"{url['trainer']}/status", timeout=10).json()
            print(f"{(time.monotonic() - start) / 60:5.1f} min: step {status['step']} version {status['version']} "
                  f"reward {status['mean_reward']} win {status['win_rate']} error {status['error']}", flush=True)
            if status["error"]:
                break
        history = httpx.get(f"{url['trainer']}/history", timeout=10).json()
        history["status"] = httpx.get(f"{url['trainer']}/status", timeout=10).json()
        history["rollout"] = httpx.get(f"{url['rollout']}/status", timeout=10).json()
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(60)
    history["command"] = "python -m bench.trainer run " + " ".join(sys.argv[2:])
    history["minutes"] = args.minutes
    os.makedirs("bench/out", exist_ok=True)
    with open("bench/out/training.json", "w") as f:
        json.dump(history, f, indent=1)
    plot(history, args.png)
    print(f"saved bench/out/training.json and {args.png}")


def plot(history: dict, png: str) -> None:
    """Reward / win rate per step and bytes per version, side by side, with the command in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, payloads = history["steps"], history["payloads"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = [s["step"] for s in steps]
    left.plot(x, [s["reward"] for s in steps], "o-", label="mean env reward per step")
    left.plot(x, [s["win_rate"] for s in steps], "s--", label="win rate")
    left.set_xlabel("optimizer step")
    left.set_title("GRPO on Wordle, SmolLM2-135M-Instruct (CPU)")
    left.legend()
    v = [p["version"] for p in payloads]
    right.semilogy(v, [p["delta_bytes"] for p in payloads], "o-", label="published delta (default codec)")
    right.semilogy(v, [p["raw_bytes"] for p in payloads], "s--", label="raw: int32 positions + bf16 values")
    right.semilogy(v, [p["dense_bytes"] for p in payloads], ":", label="dense bf16 model")
    right.set_xlabel("version")
    right.set_ylabel("bytes")
    right.set_title("Bytes per published version")
    right.legend()
    fig.suptitle(f"{history['command']}  ({history['minutes']} min, {len(steps)} steps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    o = modes.add_parser("overhead", help="step time with publishing on and off")
    o.add_argument("--model", default=None, help="model folder (default: the offline SmolLM2-135M-Instruct)")
    o.add_argument("--steps", type=int, default=6)
    o.add_argument("--warmup", type=int, default=1, help="first steps left out (the first version is an anchor)")
    o.add_argument("--games", type=int, default=4, help="games per step (groups of 4)")
    o.add_argument("--lr", type=float, default=1e-5)
    r = modes.add_parser("run", help="a bounded real training run, drawn to a PNG")
    r.add_argument("--model", default=None, help="model folder (default: the offline SmolLM2-135M-Instruct)")
    r.add_argument("--minutes", type=float, default=12.0)
    r.add_argument("--games", type=int, default=8, help="games per step (groups of 4)")
    r.add_argument("--max-turns", type=int, default=3)
    r.add_argument("--lr", type=float, default=2e-5)
    r.add_argument("--png", default="docs/training.png")
    args = parser.parse_args()
    (overhead if args.mode == "overhead" else real_run)(args)


if __name__ == "__main__":
    main()
