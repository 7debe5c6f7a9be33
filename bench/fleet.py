"""Request mode against the fleet, side by side in one run: steps and games per minute, and who waits.

    python -m bench.fleet [--model tiny|smollm2|PATH] [--steps 24] [--warmup 4] [--max-tokens 72]
                          [--cases request fleet1 fleet2] [--placement shared pinned] [--json bench/out/fleet.json]

Each case runs a fresh bucket, an env, its rollout server(s) and a trainer as `python app.py ROLE` processes, and
measures the last `--steps` steps after `--warmup`: steps and games per minute, the share of time the trainer waited
for games and the servers idled, the staleness of the games trained on and the importance weights. Cases: `request`
(the trainer asks one server), `fleet1`, `fleet2` (servers producing through the bucket). Placements: `shared`, and
`pinned` (`taskset`: the trainer on core 0, the rest on core 1), which stands in for separate machines on two cores."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import torch

from wire.rollout import RolloutStatus
from wire.trainer import StepRecord, TrainerHistory, TrainerStatus

#: Training settings of every case, but the reply length (`--max-tokens`): with the default, 72 tokens, playing a
#: step's games costs about what the training step does with the tiny model on a CPU (as generation does on a
#: GPU), so the overlap the fleet buys can show; the request case's trainer idle share says how the two compare.
#: With shorter replies the rollout side has time to spare (`--max-tokens 24`: room for a second server on its
#: core). The rollout servers poll the local bucket every 0.05 s: a step lasts half a second here, and a server
#: notices the room for its next batch one poll late.
TRAINING = (
    "--games-per-step",
    "8",
    "--num-generations",
    "2",
    "--max-turns",
    "3",
    "--learning-rate",
    "1e-4",
    "--reply-prefix",
    "<guess>",
    "--max-staleness",
    "2",
)
ROLLOUT = ("--engine", "transformers", "--poll-interval", "0.05", "--showcase-every", "0", "--device", "cpu")


@dataclass(frozen=True)
class Case:
    name: str
    servers: int
    fleet: bool


CASES = {"request": Case("request", 1, False), "fleet1": Case("fleet1", 1, True), "fleet2": Case("fleet2", 2, True)}


def model_folder(name: str, root: str) -> str:
    if name == "tiny":
        from models import build_tiny_qwen3

        return build_tiny_qwen3(os.path.join(root, "tiny"), seed=0)
    from models import resolve_model

    return resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct" if name == "smollm2" else name)


class Stack:
    """The processes of one case; stops them all on exit."""

    def __init__(self, log: str) -> None:
        self.log = open(log, "w")  # noqa: SIM115 - the processes write it until close()
        self.procs: list[subprocess.Popen] = []

    def start(self, role: str, flags: list[str], cpu: int | None) -> str:
        from tests._env_server import free_port

        port = free_port()
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if cpu is not None else {})}
        self.procs.append(
            subprocess.Popen(
                [*pin, sys.executable, "app.py", role, *flags, "--port", str(port)],
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{role} did not start; see {self.log.name}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
            time.sleep(0.5)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def run_case(case: Case, pinned: bool, model: str, steps: int, warmup: int, root: str, max_tokens: int = 72) -> dict:
    """Run one case; return its figures."""
    bucket = os.path.join(root, f"{case.name}-{'pinned' if pinned else 'shared'}")
    shutil.rmtree(bucket, ignore_errors=True)
    trainer_cpu, rollout_cpu = (0, 1) if pinned else (None, None)
    stack = Stack(bucket + ".log")
    try:
        env = stack.start("env", [], rollout_cpu)
        servers = [
            stack.start(
                "rollout",
                [
                    "--bucket",
                    bucket,
                    "--model",
                    model,
                    "--env-url",
                    env,
                    "--server-id",
                    f"s{i}",
                    *ROLLOUT,
                    *([] if case.fleet else ["--no-produce"]),
                ],
                rollout_cpu,
            )
            for i in range(case.servers)
        ]
        asked = [] if case.fleet else ["--rollout-url", servers[0]]
        trainer = stack.start(
            "trainer",
            [
                "--bucket",
                bucket,
                "--model",
                model,
                "--env-url",
                env,
                *asked,
                "--max-steps",
                str(warmup + steps),
                "--device",
                "cpu",
                *TRAINING,
                "--max-tokens",
                str(max_tokens),
            ],
            trainer_cpu,
        )

        def status() -> TrainerStatus:
            return TrainerStatus.model_validate_json(httpx.get(f"{trainer}/status", timeout=10).content)

        def busy() -> float:
            return sum(
                RolloutStatus.model_validate_json(httpx.get(f"{u}/status", timeout=10).content).busy_s for u in servers
            )

        while status().step < warmup:
            time.sleep(0.2)
        start, busy_start = time.monotonic(), busy()
        while (s := status()).step < warmup + steps:
            if s.error:
                raise RuntimeError(f"{case.name}: the trainer stopped: {s.error}")
            time.sleep(0.2)
        wall, busy_s = time.monotonic() - start, busy() - busy_start
        history = TrainerHistory.model_validate_json(httpx.get(f"{trainer}/history", timeout=10).content)
    finally:
        stack.close()
    measured: list[StepRecord] = history.steps[warmup : warmup + steps]
    stale: Counter[int] = Counter()
    for r in measured:
        stale.update({int(k): n for k, n in r.staleness.items()})
    # (min, mean, max) of the steps that carry their importance ratios (all three, or none)
    ratios = [
        (r.ratio_min, r.ratio_mean, r.ratio_max)
        for r in measured
        if r.ratio_min is not None and r.ratio_mean is not None and r.ratio_max is not None
    ]
    return {
        "case": case.name,
        "placement": "pinned" if pinned else "shared",
        "steps": len(measured),
        "wall_s": round(wall, 2),
        "steps_per_min": round(60 * len(measured) / wall, 2),
        "games_per_min": round(60 * sum(sum(r.staleness.values()) for r in measured) / wall, 1),
        "trainer_idle": round(sum(r.wait_s or 0.0 for r in measured) / wall, 3),
        "rollout_idle": round(1 - busy_s / (wall * case.servers), 3),
        "staleness": dict(sorted(stale.items())),
        "dropped": sum(r.dropped for r in measured),
        "ratio": None
        if not ratios
        else [
            round(min(low for low, _, _ in ratios), 3),
            round(statistics.mean(mean for _, mean, _ in ratios), 3),
            round(max(high for _, _, high in ratios), 3),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="tiny (built here), smollm2 (offline wheel) or a folder")
    parser.add_argument("--steps", type=int, default=24, help="steps measured per case")
    parser.add_argument("--warmup", type=int, default=4, help="steps run before measuring")
    parser.add_argument("--max-tokens", type=int, default=72, help="tokens per reply (the games' length)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--placement", nargs="+", default=["shared", "pinned"], choices=["shared", "pinned"])
    parser.add_argument("--json", default="bench/out/fleet.json")
    args = parser.parse_args()
    if "pinned" in args.placement and (os.cpu_count() or 1) < 2:
        parser.error("--placement pinned needs 2 cores")
    root = tempfile.mkdtemp(prefix="bench-fleet-")
    model = model_folder(args.model, root)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"model {args.model}; {args.steps} steps measured after {args.warmup}; training flags {' '.join(TRAINING)} "
        f"--max-tokens {args.max_tokens}",
        flush=True,
    )
    results = []
    header = f"{'case':<8} {'place':<7} {'steps/min':>9} {'games/min':>9} {'trainer idle':>12} {'rollout idle':>12}"
    print(header + "  staleness (versions: games)  importance weight min/mean/max")
    for placement in args.placement:
        for name in args.cases:
            r = run_case(CASES[name], placement == "pinned", model, args.steps, args.warmup, root, args.max_tokens)
            results.append(r)
            print(
                f"{r['case']:<8} {r['placement']:<7} {r['steps_per_min']:>9} {r['games_per_min']:>9} "
                f"{100 * r['trainer_idle']:>11.0f}% {100 * r['rollout_idle']:>11.0f}%  {r['staleness']}  {r['ratio']}",
                flush=True,
            )
        base = next((r for r in results if r["case"] == "request" and r["placement"] == placement), None)
        if base:
            for r in results:
                if r["placement"] == placement and r is not base:
                    print(
                        f"  {placement}: {r['case']} / request steps per minute = "
                        f"{r['steps_per_min'] / base['steps_per_min']:.2f}x"
                    )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {
                "command": "python -m bench.fleet " + " ".join(sys.argv[1:]),
                "model": args.model,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "results": results,
            },
            f,
            indent=1,
        )
    shutil.rmtree(root, ignore_errors=True)
    print(f"saved {args.json}")


if __name__ == "__main__":
    main()
