"""What publishing costs the trainer, and a bounded real training run.

    python -m bench.trainer overhead [--model PATH] [--triples 4] [--warmup 2] [--games 4]
    python -m bench.trainer run [--minutes 12] [--device auto] [--seed 0] [--examples fading] [--exam-every 5]
                                [--png docs/training.png]

`overhead`: the trainer's own session (TRL's GRPOTrainer, the publish callback, a local bucket) on a fixed batch of
games replayed every step, publishing every third step (`EveryThird`): in each triple the first step pays the
snapshot copy, the second runs beside the background encode and upload, the third is clean. The median over triples
of (first + second) / (2 x third) is what publishing after every step costs (goal: <= 5 % of a step); interleaving
keeps it honest on a shared machine.

`run`: env, rollout and trainer as `python app.py ROLE` processes on a fresh local bucket with SmolLM2-135M-Instruct,
for `--minutes`, with the trainer's defaults unless flags say otherwise; each exam is printed as it comes. Then the
trainer's `/history`, a summary (reward, win and valid-guess rates over the first and last `--window` steps; the
exams; the no-collapse check; the words and copied examples of the last games) and those games go to `--json`, and the
curves to `--png`. At the end the roles get SIGTERM at once; one still running `--stop-timeout` seconds later is
killed. The JSON is written whatever happened (`stops`, `killed_roles`, `logs`)."""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch
from pydantic import TypeAdapter

import delta
import settings
from dashboard.exam import exam_text
from env_space.exam import copying_games
from env_space.words import load_word_lists
from launcher.children import Child, exit_text, stop_all
from trainer_space import TrainerConfig, build_session
from trainer_space.credit import CREDITS
from wire.env import GameRecord
from wire.exam import ExamRecord
from wire.rollout import RolloutStatus, Trajectory
from wire.trainer import StepRecord, TrainerHistory, TrainerStatus
from wire.wordle import letters_found

T = TypeVar("T")


class ReplayedGames:
    """Stands in for the rollout Space's client in this benchmark: the same games every step."""

    def __init__(self, vocab: int, prompt_len: int, completion_len: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab, self.prompt_len, self.completion_len = vocab, prompt_len, completion_len
        self.batch: dict[int, Trajectory] = {}

    def rollout(self, games: Sequence[dict], **_: object) -> list[Trajectory]:
        out = []
        for i in range(len(games)):
            if i not in self.batch:
                r = self.rng
                mask = [1 if (t // 30) % 2 == 0 else 0 for t in range(self.completion_len)]  # model/env turns
                self.batch[i] = Trajectory(
                    prompt_ids=[r.randrange(self.vocab) for _ in range(self.prompt_len)],
                    episode_id=f"replayed-{i}",
                    completion_ids=[r.randrange(self.vocab) for _ in range(self.completion_len)],
                    logprobs=[-1.0] * self.completion_len,
                    env_mask=mask,
                    reward=r.uniform(-1, 1),
                    secret="crane",
                    versions=[0],
                )
            out.append(self.batch[i])
        return out


class EveryThird:
    """Publishes at the end of every third step only, so each triple of steps holds one with the copy,
    one with the background encode and upload running beside it, and one clean step to compare with."""

    def __init__(self, publisher: delta.Publisher, warmup: int) -> None:
        self.publisher, self.warmup, self.calls = publisher, warmup, 0

    def publish(self, state: Mapping[str, torch.Tensor | delta.pieces.Slice]) -> None:
        self.calls += 1  # = the step number; warm-up steps all publish (the first is the anchor)
        if self.calls <= self.warmup or (self.calls - self.warmup) % 3 == 1:
            self.publisher.publish(state)

    @property
    def last(self) -> delta.PublishedVersion | None:
        return self.publisher.last

    @property
    def state_version(self) -> int:
        return self.publisher.state_version

    def flush(self, timeout: float | None = None) -> bool:
        return self.publisher.flush(timeout)

    def __getattr__(self, name: str) -> object:  # idle, close, ...: the real publisher's
        return getattr(self.publisher, name)


def overhead(args: argparse.Namespace) -> None:
    from transformers import AutoConfig

    from models import resolve_model

    model = resolve_model(args.model)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads; load avg {os.getloadavg()[0]:.1f}"
    )
    print(f"model: {model}; {args.games} games x (120 prompt + 120 completion tokens) per step, lr {args.lr}")
    bucket = tempfile.mkdtemp(prefix="bench-trainer-")
    steps = args.warmup + 3 * args.triples
    config = TrainerConfig(
        bucket=bucket,
        rollout_url="http://replayed",
        model=model,
        games_per_step=args.games,
        num_generations=4,
        max_steps=steps,
        learning_rate=args.lr,
        max_staleness=10**9,
        output_dir=os.path.join(bucket, "out"),
    )
    vocab = AutoConfig.from_pretrained(model).vocab_size
    session = build_session(
        config,
        client=ReplayedGames(vocab, prompt_len=120, completion_len=120),
        wrap_publisher=lambda publisher: EveryThird(publisher, args.warmup),
    )
    session.start()
    session.wait()
    if session.error:
        raise RuntimeError(session.error)
    session.close()
    records = list(session.records)[args.warmup :]
    ratios, copies = [], []
    for i in range(0, len(records) - 2, 3):
        copy, beside, clean = records[i : i + 3]
        ratios.append((copy.step_s + beside.step_s) / (2 * clean.step_s))
        copies.append(copy.publish_s)
        print(
            f"steps {copy.step}-{clean.step}: with copy {copy.step_s:.2f} s (publish() blocked "
            f"{1000 * copy.publish_s:.0f} ms), beside the upload {beside.step_s:.2f} s, clean {clean.step_s:.2f} s"
        )
    assert session.payloads is not None  # a session that published
    sizes = [p.delta_bytes for p in session.payloads.records]
    ratio = statistics.median(ratios)
    print(
        f"delta {statistics.median(sizes):,.0f} B per version vs dense {session.payloads.dense_bytes:,} B; "
        f"median publish() block {1000 * statistics.median(copies):.0f} ms"
    )
    print(
        f"publishing on/off step time ratio: {ratio:.3f} (median of {len(ratios)} triples: publishing costs "
        f"{100 * (ratio - 1):+.1f} % of a step; goal <= 5 %)"
    )


def role_children(root: str, model: str, args: argparse.Namespace) -> list[Child]:
    """The three roles of `run` (env, rollout, trainer, in start order) as `python app.py ROLE` processes on free
    loopback ports and a fresh bucket under `root`, each logging to `root/ROLE.log`, with the tokens the apps check
    or send (fresh, as `python app.py` makes them). Each starts in its own process group (`launcher.children`), so
    stopping one stops what it spawned too."""
    from launcher.tokens import launch_tokens, role_environ
    from tests._env_server import free_port

    bucket = os.path.join(root, "bucket")
    ports = {role: free_port() for role in ("env", "rollout", "trainer")}  # never a server left from a run before
    env_url = f"http://127.0.0.1:{ports['env']}"
    roles = {
        "env": _given({"--own-word-reward": args.own_word_reward, "--five-letter-reward": args.five_letter_reward}),
        "rollout": [
            "--bucket",
            bucket,
            "--model",
            model,
            "--env-url",
            env_url,
            "--engine",
            "transformers",
            "--showcase-every",
            "0",
            "--device",
            args.device,
        ],
        # as `python app.py` runs them: the trainer takes its games from the fleet, through the bucket
        "trainer": [
            "--bucket",
            bucket,
            "--model",
            model,
            "--env-url",
            env_url,
            "--max-steps",
            "100000",
            "--device",
            args.device,
            "--seed",
            str(args.seed),
            *_given(
                {
                    "--games-per-step": args.games,
                    "--num-generations": args.num_generations,
                    "--max-tokens": args.max_tokens,
                    "--max-turns": args.max_turns,
                    "--learning-rate": args.lr,
                    "--credit": args.credit,
                    "--temperature": args.temperature,
                    "--kl": args.kl,
                    "--examples": args.examples,
                    "--fade-start": args.fade_start,
                    "--fade-end": args.fade_end,
                    "--exam-every": args.exam_every,
                    "--exam-games": args.exam_games,
                    "--exam-turns": args.exam_turns,
                }
            ),
            *(["--exam-greedy"] if args.exam_greedy else []),
        ],
    }
    tokens = launch_tokens({})
    return [
        Child(role, "127.0.0.1", ports[role], flags, os.path.join(root, f"{role}.log"), role_environ(role, tokens))
        for role, flags in roles.items()
    ]


def stop_roles(children: Sequence[Child], timeout_s: float) -> dict[str, dict[str, object]]:
    """SIGTERM every role at once and wait for them side by side, up to `timeout_s` seconds, then SIGKILL what is
    left (`launcher.children.stop_all`): returns at most about `timeout_s` seconds after the signal, however a role
    stops. How each ended, by role, as the JSON keeps it: `ended` in words, `code`, `killed` (it did not stop in
    time) and `seconds` from the signal."""
    stopped = stop_all(children, timeout_s, lambda line: print(line, flush=True), by="bench.trainer")
    return {
        name: {
            "ended": exit_text(end, "bench.trainer"),
            "code": None if end is None else end.code,
            "killed": end is not None and end.forced,
            "seconds": None if end is None else end.seconds,
        }
        for name, end in stopped.items()
    }


def _fetch(url: str, parse: Callable[[bytes], T], **params: str | int) -> T | None:
    """GET `url` and parse its answer; None (said) when the role does not answer or answers nonsense: what the
    other roles answered is still saved."""
    import httpx

    try:
        return parse(httpx.get(url, timeout=10, params=params).content)
    except (httpx.HTTPError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        print(f"no answer from {url}: {type(e).__name__}: {e}", flush=True)
        return None


def real_run(args: argparse.Namespace) -> None:
    import sys

    from models import resolve_model

    model = resolve_model(args.model)
    root = tempfile.mkdtemp(prefix="training-run-")
    children = role_children(root, model, args)
    url = {c.role: c.url for c in children}
    history = status = rollout = None
    games: list[GameRecord] = []
    try:
        for child in children:
            child.start()
            child.wait_ready(300, threading.Event())  # ChildFailed, with the end of its log, if it does not
        start = time.monotonic()
        examined: set[int] = set()
        while time.monotonic() - start < 60 * args.minutes:
            time.sleep(10)
            status = _fetch(f"{url['trainer']}/status", TrainerStatus.model_validate_json)
            if status is None:
                break
            print(
                f"{(time.monotonic() - start) / 60:5.1f} min: step {status.step} version {status.version} "
                f"reward {status.mean_reward} win {status.win_rate} valid {status.valid_rate} "
                f"letters {status.letters} load {os.getloadavg()[0]:.1f} error {status.error}",
                flush=True,
            )
            for exam in status.exams:
                if exam.version not in examined:
                    examined.add(exam.version)
                    print(f"        exam {exam_text(exam)} ({exam.played_s:.0f} s)", flush=True)
            if status.error:
                break
        history = _fetch(f"{url['trainer']}/history", TrainerHistory.model_validate_json)
        status = _fetch(f"{url['trainer']}/status", TrainerStatus.model_validate_json) or status
        rollout = _fetch(f"{url['rollout']}/status", RolloutStatus.model_validate_json)
        played = _fetch(f"{url['env']}/games", _GAMES.validate_json, limit=200, policy_only=True) or []
        games = [g for g in played if not g.exam][:LAST_GAMES]  # the training games (exams are in /history)
    finally:  # every role is stopped, within --stop-timeout however it stops, and the run is saved regardless
        stops = stop_roles(children, args.stop_timeout)
        save_run(
            args, "python -m bench.trainer run " + " ".join(sys.argv[2:]), history, status, rollout, games, stops, root
        )


def save_run(
    args: argparse.Namespace,
    command: str,
    history: TrainerHistory | None,
    status: TrainerStatus | None,
    rollout: RolloutStatus | None,
    games: Sequence[GameRecord],
    stops: dict[str, dict[str, object]],
    logs: str,
) -> None:
    """Print the run's summary and write it to `--json` (and draw `--png`): what the roles answered (None: that
    role did not), how each role stopped (`stops`, with `killed_roles`: those killed after `--stop-timeout`), and
    where the roles' logs are."""
    import json

    killed = [name for name, stop in stops.items() if stop["killed"]]
    results = run_summary(history.steps, history.exams, games, args) if history is not None else {}
    print(f"the policy's last {len(games)} games (newest first):")
    for g in games[:8]:
        first = f"; first reply {g.replies[0][:60]!r}" if g.replies else ""
        print(
            f"  {g.player}: {' '.join(g.words).upper() or '(no valid guess)'}, {g.invalid_moves} invalid, "
            f"reward {g.total_reward:+.2f}{first}"
        )
    print("the exams (held-out words, no examples, never trained on):")
    for exam in history.exams if history is not None else []:
        print(f"  {exam_text(exam)}; words {' '.join(exam.scores.words[:12]).upper() or '-'}")
    print(json.dumps(results, indent=1))
    if killed:
        print(f"killed after --stop-timeout {args.stop_timeout:.0f} s: {', '.join(killed)} (see the logs in {logs})")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {
                **(history.model_dump(mode="json") if history is not None else {}),
                "status": status.model_dump(mode="json") if status is not None else None,
                "rollout": rollout.model_dump(mode="json") if rollout is not None else None,
                "command": command,
                "minutes": args.minutes,
                "summary": results,
                "last_games": [g.model_dump(mode="json") for g in games],
                "stops": stops,
                "killed_roles": killed,
                "logs": logs,
            },
            f,
            indent=1,
        )
    if history is None or status is None:
        print(f"saved {args.json} (no figure: the trainer did not answer)")
        return
    try:
        plot(history, status.device, f"{command}  ({args.minutes} min, {len(history.steps)} steps)", args.png)
    except ModuleNotFoundError as e:  # the run's numbers are saved: a missing plotting package loses nothing
        print(f"saved {args.json}; no figure: {e} (pip install matplotlib -c constraints.txt)")
        return
    print(f"saved {args.json} and {args.png}")


#: The policy's latest games (from the env) kept in the JSON, to show what it writes by the end.
LAST_GAMES = 40
_GAMES = TypeAdapter(list[GameRecord])


def run_summary(
    steps: list[StepRecord], exams: Sequence[ExamRecord], games: Sequence[GameRecord], args: argparse.Namespace
) -> dict[str, object]:
    """What `run` prints and saves about a finished run: the curves' ends (`summary`), the exam series and the
    collapse check, what the policy's last games wrote, and the letters a copy-only player finds with the run's
    moves per game (the trainer's default where `--max-turns` was not given)."""
    max_turns = TrainerConfig.max_turns if args.max_turns is None else args.max_turns
    return {
        **summary(steps, args.window),
        **exam_summary(exams),
        **collapse(steps),
        "distinct_words_last_games": len({w for g in games for w in g.words}),
        "scored_but_not_the_first_word": not_first_words(games),
        **examples_played(games),
        "letters_found_by_copying_only": copying_baseline(max_turns),
        "load_average_1min_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def _given(flags: dict[str, object]) -> list[str]:
    """The flags given a value; the others are left to the trainer's defaults (what `python app.py` runs)."""
    return [part for flag, value in flags.items() if value is not None for part in (flag, str(value))]


def not_first_words(games: Sequence[GameRecord]) -> int:
    """Moves of `games` whose scored word is not the first word the player wrote after the last <guess> tag
    (read here by hand, not by the env's parser): 0 is what the strict rule promises."""
    wrong = 0
    for g in games:
        for reply, guess in zip(g.replies, g.guesses, strict=True):
            if guess:
                after = re.split("<guess>", reply, flags=re.IGNORECASE)[-1].split("<")[0].split()
                wrong += not after or after[0].strip("\"'`*_.,;:!?()[]{}<>").lower() != guess
    return wrong


def examples_played(games: Sequence[GameRecord]) -> dict[str, int]:
    """Scored words of `games`' later moves, and how many of them are the example guess the env's message
    showed before that move (`GameRecord.examples`): how much of the valid-guess rate is the policy copying
    the env's example rather than choosing a word."""
    later = [
        (guess, example)
        for g in games
        for guess, example in list(zip(g.guesses, g.examples, strict=False))[1:]
        if guess
    ]
    return {"later_moves_scored": len(later), "later_moves_playing_the_example": sum(g == e for g, e in later)}


def copying_baseline(moves: int, games: int = 400) -> float:
    """Mean letters found (`letters_found`) by a player that only ever plays the example the env's message
    shows, over `games` seeded secrets of `moves` moves: the baseline a policy that learned only to copy
    reaches, to read the run's letters found against."""
    words = load_word_lists()
    played = copying_games(words, [words.pick_secret(seed) for seed in range(games)], moves)
    return statistics.fmean(letters_found(g.marks) for g in played)


def exam_summary(exams: Sequence[ExamRecord]) -> dict[str, object]:
    """The exam series, and the targets' figures: the strict valid-guess rate of own words at the first exam
    and over the last two, its rise in points, and the last two exams' letters found against the copy-only
    player's on the same words (`ExamRecord.copying`)."""
    if not exams:
        return {"exams": 0}
    last = exams[-2:]
    first_own, last_own = exams[0].scores.own_rate, statistics.fmean(e.scores.own_rate for e in last)
    copying = exams[-1].copying
    return {
        "exams": len(exams),
        "exam_versions": [e.version for e in exams],
        "exam_own_rate": [round(e.scores.own_rate, 4) for e in exams],
        "exam_valid_rate": [round(e.scores.valid_rate, 4) for e in exams],
        "exam_letters": [round(e.scores.letters, 4) for e in exams],
        "exam_wins": [e.scores.wins for e in exams],
        "exam_own_first": first_own,
        "exam_own_last_two": last_own,
        "exam_own_rise_points": round(100 * (last_own - first_own), 1),
        "exam_letters_last_two": statistics.fmean(e.scores.letters for e in last),
        "exam_letters_copying_only": copying.letters if copying is not None else None,
    }


def collapse(steps: Sequence[StepRecord], at: int = 10) -> dict[str, object]:
    """The no-collapse check: the training valid-guess rate at step `at`, and the longest run of later steps in
    a row below it (the target: never more than 5)."""
    if len(steps) < at:
        return {"valid_rate_at_step_10": None, "longest_run_below_it": None}
    level = steps[at - 1].valid_rate
    longest = run = 0
    for s in steps[at:]:
        run = run + 1 if s.valid_rate is not None and level is not None and s.valid_rate < level else 0
        longest = max(longest, run)
    return {"valid_rate_at_step_10": level, "longest_run_below_it": longest}


def summary(steps: list[StepRecord], window: int) -> dict[str, float | None]:
    """Mean reward, win rate, strict valid-guess rate and letters found over the first and the last `window`
    steps (steps with no games left out)."""

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    first, last = steps[:window], steps[-window:]
    return {
        "steps": len(steps),
        "window": window,
        "reward_first": mean([s.reward for s in first]),
        "reward_last": mean([s.reward for s in last]),
        "win_rate_first": mean([s.win_rate for s in first]),
        "win_rate_last": mean([s.win_rate for s in last]),
        "valid_rate_first": mean([s.valid_rate for s in first]),
        "valid_rate_last": mean([s.valid_rate for s in last]),
        "letters_first": mean([s.letters for s in first]),
        "letters_last": mean([s.letters for s in last]),
    }


def plot(history: TrainerHistory, device: str, title: str, png: str) -> None:
    """Reward / win rate per step and bytes per version, side by side, with the command in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps, payloads = history.steps, history.payloads
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(18, 5))
    x = [s.step for s in steps]
    left.plot(x, [s.reward for s in steps], "o-", label="mean env reward per step")
    left.plot(x, [s.win_rate for s in steps], "s--", label="win rate")
    left.plot(x, [s.valid_rate for s in steps], "^:", label="valid-guess rate (strict)")
    left.plot(x, [None if s.letters is None else s.letters / 5 for s in steps], "d-.", label="letters found / 5")
    left.set_xlabel("optimizer step")
    left.set_title(f"GRPO on Wordle, SmolLM2-135M-Instruct ({device})")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    exams = history.exams
    e = [r.version for r in exams]
    middle.plot(e, [r.scores.own_rate for r in exams], "o-", label="exam: valid-guess rate, own words")
    middle.plot(e, [r.scores.valid_rate for r in exams], "s--", label="exam: any valid word")
    middle.plot(e, [r.scores.letters / 5 for r in exams], "d-.", label="exam: letters found / 5")
    untrained = next((r for r in exams if r.version == 0), None)
    if untrained is not None:
        middle.axhline(untrained.scores.own_rate, color="tab:red", ls=":", label="untrained (v0): own words")
    if exams and exams[-1].copying is not None:
        middle.axhline(exams[-1].copying.letters / 5, color="tab:green", ls=":", label="copy-only: letters / 5")
    middle.set_xlabel("version examined")
    middle.set_ylim(-0.05, 1.05)
    middle.set_title("Exam: held-out words, no examples, never trained on")
    middle.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8)
    v = [p.version for p in payloads]
    right.semilogy(v, [p.delta_bytes for p in payloads], "o-", label="published delta (default codec)")
    right.semilogy(v, [p.raw_bytes for p in payloads], "s--", label="raw: int32 positions + bf16 values")
    right.semilogy(v, [p.dense_bytes for p in payloads], ":", label="dense bf16 model")
    right.set_xlabel("version")
    right.set_ylabel("bytes")
    right.set_title("Bytes per published version")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8)
    for axis in (left, middle, right):  # steps and versions are counts: no "2.5"
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    """The flags of both modes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    o = modes.add_parser("overhead", help="step time with publishing on and off")
    o.add_argument("--model", default=None, help="model folder (default: the offline SmolLM2-135M-Instruct)")
    o.add_argument("--triples", type=int, default=4, help="triples of steps measured (see EveryThird)")
    o.add_argument("--warmup", type=int, default=2, help="first steps left out (the first version is an anchor)")
    o.add_argument("--games", type=int, default=4, help="games per step (groups of 4)")
    o.add_argument("--lr", type=float, default=1e-5)
    r = modes.add_parser("run", help="a bounded real training run, drawn to a PNG")
    r.add_argument("--model", default=None, help="model folder (default: the offline SmolLM2-135M-Instruct)")
    r.add_argument("--minutes", type=float, default=12.0)
    r.add_argument("--games", type=int, default=None, help="games per step, groups of 4 (default: the trainer's)")
    r.add_argument(
        "--num-generations", type=int, default=None, help="games per word, the GRPO group (default: the trainer's)"
    )
    r.add_argument("--max-tokens", type=int, default=None, help="tokens per reply (default: the trainer's)")
    r.add_argument("--max-turns", type=int, default=None, help="guesses per game (default: the trainer's)")
    r.add_argument("--lr", type=float, default=None, help="learning rate (default: the trainer's)")
    r.add_argument("--credit", choices=CREDITS, default=None, help="what GRPO credits (default: the trainer's)")
    r.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the trainer's)")
    r.add_argument(
        "--kl", type=float, default=None, help="KL weight to the reference model (default: the trainer's, 0)"
    )
    r.add_argument(
        "--examples",
        choices=["off", "fixed", "fading"],
        default=None,
        help="the env's examples in training games (default: the trainer's, fading)",
    )
    r.add_argument("--fade-start", type=int, default=None, help="fading: last version showing every example")
    r.add_argument("--fade-end", type=int, default=None, help="fading: first version showing none")
    r.add_argument(
        "--exam-every", type=int, default=None, help="an exam every this many versions (default: the trainer's)"
    )
    r.add_argument("--exam-games", type=int, default=None, help="held-out words per exam (default: the trainer's)")
    r.add_argument("--exam-turns", type=int, default=None, help="replies per exam game (default: --max-turns)")
    r.add_argument("--exam-greedy", action="store_true", help="greedy exams (default: the training temperature)")
    r.add_argument(
        "--own-word-reward",
        type=float,
        default=None,
        help="the env's reward term for a word of the policy's own (default: the env's)",
    )
    r.add_argument(
        "--five-letter-reward",
        type=float,
        default=None,
        help="the env's reward back for a non-word of five letters (default: the env's)",
    )
    r.add_argument("--device", default="auto", help="trainer and engine device: auto, cpu, cuda (default auto)")
    r.add_argument("--seed", type=int, default=0, help="the trainer's seed (game order, sampling)")
    r.add_argument("--window", type=int, default=5, help="steps averaged at each end for the summary")
    r.add_argument("--png", default="docs/training.png")
    r.add_argument("--json", default="bench/out/training.json", help="where the history and summary go")
    r.add_argument(
        "--stop-timeout",
        type=float,
        default=settings.STOP_TIMEOUT_S,
        help="seconds the roles get to exit after SIGTERM before they are killed (default "
        f"{settings.STOP_TIMEOUT_S}; each promises {settings.STOP_WITHIN_S})",
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    (overhead if args.mode == "overhead" else real_run)(args)


if __name__ == "__main__":
    main()
