"""What the product asks of a Hugging Face account: requests per 5 minutes by the Hub's classes, per role, against
the local Hub (tests/local_hub: the real huggingface_hub and hf_xet), next to the free and PRO limits, and the same
traffic priced as S3 requests.

    python -m bench.hub_requests --servers 1 2 4 8 --seconds 300       # the table of docs/benchmarks.md
    python -m bench.hub_requests --servers 1 --seconds 120 --routes     # and every route each role called
    python -m bench.hub_requests --servers --rest-seconds 120           # the resting readers alone

Each configuration runs env, a trainer (the tiny test model, training without end) and N rollout servers as real
processes on one bucket (`hf://buckets/alice/fleet-run`), each role with a token of its own, so the local Hub counts
requests per role (`api`: listings, paths-info, batch calls, Xet tokens; `resolver`: `/resolve/`; `cas`: Xet
storage). After a warm-up (the first step) it counts for `--seconds` and scales to 5 minutes. The resting readers (a
`Subscriber` and `delta follow`, each with its default settings, which follow the bucket's kind: `delta.Budget`) are
measured apart, for `--rest-seconds`. S3
pricing: the fleet's listings and writes as PUTs, its file reads as GETs, at AWS S3 Standard's prices — what the same
traffic would cost on S3, not a run against S3.

Requests, not seconds: the counts depend on the cadence (the trainer's flags are `tests._trainer_stack.DEMO_PACE`: the
tiny model's games set a pace like the demo's), which the table states per row.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

FREE = {"api": 1000, "resolver": 5000}
PRO = {"api": 2500, "resolver": 12000}
BUCKET = "hf://buckets/team/fleet-run"
WINDOW_S = 300.0
#: What the same traffic would be on S3, by the routes the Hub saw: a listing is a LIST and a file written a PUT (both
#: priced as PUTs; a batch call that deletes is priced so too, though S3 deletes are free: an upper bound), a file read
#: one GET (one reconstruction on the Hub). AWS S3 Standard's prices per request (us-east-1, 2026).
S3_PUTS = ("api.tree", "api.tree_prefix", "api.batch")
S3_GETS = ("cas.reconstruction_v2", "cas.reconstruction_v1")
PUT_USD, GET_USD = 0.005 / 1000, 0.0004 / 1000


def member_token(hub, role: str) -> str:
    """A write token of a user of its own for `role`, a member of the bucket's org (the local Hub counts per user:
    Hub requests by the token, Xet storage requests by the Xet token it handed that user)."""
    hub.add_user(role, ["team"])
    return hub.add_token(role)


def run_fleet(servers: int, seconds: float, show_routes: bool) -> tuple[dict[str, Counter], Counter, float]:
    """Env, trainer and `servers` rollout servers on a local Hub: requests per role in `seconds` after the first
    step, scaled to 5 minutes; the whole fleet's by route, so scaled; seconds a step."""
    from tests._env_server import running_app, running_server
    from tests._trainer_stack import DEMO_PACE, tiny_model
    from tests.local_hub.server import LocalHub

    with tempfile.TemporaryDirectory() as tmp, LocalHub(Path(tmp) / "hub") as hub, contextlib.ExitStack() as stack:
        model = tiny_model(str(Path(tmp) / "model"))
        tokens = {role: member_token(hub, role) for role in ["trainer", *(f"rollout-{i}" for i in range(servers))]}
        base = {**hub.env("alice"), "HF_XET_CACHE": str(Path(tmp) / "xet"), "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        env = stack.enter_context(running_server("env"))
        trainer_args = ["--bucket", BUCKET, "--model", model, "--env-url", env, "--max-steps", "100000", *DEMO_PACE]
        trainer_env = {**base, "HF_TOKEN": tokens["trainer"]}
        trainer = stack.enter_context(
            running_app("trainer", *trainer_args, env=trainer_env, log=Path(tmp) / "trainer.log", timeout_s=600)
        )
        for i in range(servers):
            rollout_args = ["--bucket", BUCKET, "--model", model, "--env-url", env, "--server-id", f"r{i}"]
            rollout_args += ["--engine", "transformers", "--showcase-every", "0"]
            rollout_env = {**base, "HF_TOKEN": tokens[f"rollout-{i}"]}
            log = Path(tmp) / f"rollout-{i}.log"
            stack.enter_context(running_app("rollout", *rollout_args, env=rollout_env, log=log, timeout_s=600))
        deadline = time.monotonic() + 600
        while httpx.get(f"{trainer.url}/status", timeout=10).json()["step"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("no first step within 10 minutes")
            time.sleep(2)
        hub.reset_counts()
        start = time.monotonic()
        steps_before = httpx.get(f"{trainer.url}/status", timeout=10).json()["step"]
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        steps = httpx.get(f"{trainer.url}/status", timeout=10).json()["step"] - steps_before
        seen = hub.counts()
        counts = {role: Counter(seen["users"].get(role, {})) for role in tokens}
        routes_all = sum((Counter(seen["user_routes"].get(role, {})) for role in tokens), Counter())
        if show_routes:
            for role in tokens:
                routes = Counter(seen["user_routes"].get(role, {}))
                print(f"  {role}: " + ", ".join(f"{r} {n}" for r, n in routes.most_common()))
        scale = WINDOW_S / elapsed
        print(f"  {servers} server(s): {steps} steps in {elapsed:.0f} s ({elapsed / max(steps, 1):.0f} s a step)")
        scaled = {role: Counter({k: round(v * scale) for k, v in c.items()}) for role, c in counts.items()}
        return scaled, Counter({k: v * scale for k, v in routes_all.items()}), elapsed / max(steps, 1)


def quiet_server() -> Any:
    """A client of a vLLM server with the `delta` backend that takes every call in-process and serves nothing: what
    `delta follow` costs the bucket, measured alone."""
    from delta.integrations.vllm_http import VLLMHTTPClient
    from delta.integrations.vllm_update import WorkerInfo, write_worker_info

    class Quiet(VLLMHTTPClient):
        def _call(self, method: str, route: str, body: dict | None = None, *args: Any, **kwargs: Any) -> Any:
            if route.endswith("init_weight_transfer_engine") and body is not None:  # the worker's handshake
                write_worker_info(body["init_info"]["handshake_dir"], 0, WorkerInfo("cpu", {}, "quiet"))
            return {"is_paused": False} if route == "/is_paused" else None

    return Quiet("http://127.0.0.1:1")


def resting_readers(seconds: float) -> dict[str, Counter]:
    """A `Subscriber` and `delta follow` (its loop, against a server stand-in) with their default settings, at rest on
    a Hub bucket holding one version (counted once their looks have slowed down): requests per 5 minutes by class,
    each reader with a token of its own."""
    import threading

    from delta import Bucket, Publisher, Subscriber
    from delta.follow import FollowConfig, ServerFollower
    from tests._trainer import trajectory
    from tests.local_hub.server import LocalHub

    with tempfile.TemporaryDirectory() as tmp, LocalHub(Path(tmp) / "hub") as hub:
        with Publisher(BUCKET, token=hub.token("alice"), endpoint=hub.endpoint) as pub:
            pub.publish(trajectory(1, n=1000)[1])
        readers = {
            name: Bucket.open(BUCKET, token=member_token(hub, name), endpoint=hub.endpoint)
            for name in ("subscriber", "follow")
        }
        sub = Subscriber(readers["subscriber"])
        follower = ServerFollower(
            FollowConfig(BUCKET, "http://quiet"), quiet_server(), lambda line: None, bucket=readers["follow"]
        )
        sub.sync()
        sub.start()
        stop = threading.Event()
        loop = threading.Thread(target=follower.run, args=(stop,), daemon=True)
        loop.start()
        while follower.status.version is None:  # the one version applied
            time.sleep(0.1)
        time.sleep(2 * readers["follow"].budget.idle_poll_s)  # the looks that found nothing have slowed to the slowest
        hub.reset_counts()
        time.sleep(seconds)
        stop.set()
        sub.close()
        loop.join(30)
        follower.close()
        counts = {name: Counter(hub.counts()["users"].get(name, {})) for name in readers}
        return {name: Counter({k: round(v * WINDOW_S / seconds) for k, v in c.items()}) for name, c in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--servers", type=int, nargs="*", default=[1, 2, 4, 8], help="fleets run (none: only the resting readers)"
    )
    parser.add_argument("--seconds", type=float, default=300.0, help="counted after the first step, per fleet")
    parser.add_argument("--rest-seconds", type=float, default=300.0, help="the resting readers' count")
    parser.add_argument("--routes", action="store_true", help="print every route each role called")
    args = parser.parse_args()
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bench-hub-cache-")  # keys it makes stay out of yours
    print(
        f"on {platform.machine()}, {platform.python_version()}; local Hub (tests/local_hub), huggingface_hub + "
        "hf_xet; requests per 5 minutes"
    )
    for name, rest in resting_readers(args.rest_seconds).items():
        api = rest.get("api", 0)
        print(
            f"a resting {name} (default settings): api {api} ({api / 5:.1f} a minute), resolver "
            f"{rest.get('resolver', 0)}, cas {rest.get('cas', 0)}"
        )
    rows, s3 = [], []
    for n in args.servers:
        counts, routes, step_s = run_fleet(n, args.seconds, args.routes)
        total = sum(counts.values(), Counter())
        servers = [c.get("api", 0) for role, c in counts.items() if role != "trainer"]
        share = f"{100 * total.get('api', 0) / FREE['api']:.0f} % / {100 * total.get('api', 0) / PRO['api']:.0f} %"
        rows.append(
            f"| {n} | {step_s:.0f} s | {counts['trainer'].get('api', 0):,} | {min(servers):,}-{max(servers):,} | "
            f"{total.get('api', 0):,} | {share} | {total.get('resolver', 0):,} | {total.get('cas', 0):,} |"
        )
        puts, gets = (12 * sum(routes.get(r, 0) for r in kind) for kind in (S3_PUTS, S3_GETS))
        s3.append(f"| {n} | {puts:,.0f} | {gets:,.0f} | ${24 * (puts * PUT_USD + gets * GET_USD):.2f} |")
    if not rows:
        return
    print("requests per 5 minutes, API class unless said (free account 1,000 API and 5,000 resolver; PRO 2,500 API):")
    print("| servers | a step every | trainer | each server | all, API | of free / PRO | resolver | Xet storage |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("the same traffic on S3 (AWS S3 Standard prices; deletes counted as PUTs, an upper bound):")
    print("| servers | PUT/LIST per hour | GET per hour | per day |")
    print("|---|---|---|---|")
    print("\n".join(s3))


if __name__ == "__main__":
    main()
