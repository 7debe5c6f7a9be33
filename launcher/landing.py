"""The landing page of ``python app.py`` (port 7860): links to the three UIs with their live status.

A small FastAPI app, served by uvicorn in a thread of the launcher: ``GET /`` is a static page that
polls ``GET /api/status`` every two seconds; that endpoint asks each running app for its own
``/status`` (rollout, trainer) or ``/stats`` (env: its games by player and kind), with a one-second timeout
each, and reads the answer with the app's own message (`RolloutStatus`, `TrainerStatus`, `PlayerStats`): an
app that answers something else gets a card saying so.
"""

from __future__ import annotations

import asyncio
import html
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from pydantic import TypeAdapter, ValidationError

from dashboard.exam import exam_text, exam_trend_text, refused_exams_text
from dashboard.examples import example_rows
from dashboard.labels import public_location
from dashboard.trend import WINDOW, step_text, trend_text
from wire.env import HUMAN, GameKind, PlayerStats
from wire.rollout import RolloutStatus
from wire.trainer import FleetServer, TrainerStatus

from .children import Child
from .restarts import Supervisor

TITLES = {"env": "Wordle environment", "rollout": "Rollout (inference)", "trainer": "Trainer (TRL GRPO)"}
#: The rollout card's row of the version its server serves (`freshen_fleet` reads it too).
VERSION_FIELD = "weights version"
BLURBS = {
    "env": "Play Wordle yourself; the rollout plays its games here.",
    "rollout": "Follows the bucket, applies each delta, plays games with the current policy.",
    "trainer": "Trains on those games and publishes a sparse delta per step to the bucket.",
}


async def _app_status(client: httpx.AsyncClient, child: Child, restarts: Supervisor | None = None) -> dict[str, Any]:
    """One card's data: the launcher's view of the process (its state, its restarts), plus what the app says
    about itself."""
    title = TITLES[child.role] + (f" · {child.name}" if child.name != child.role else "")
    card: dict[str, Any] = {
        "role": child.role,
        "name": child.name,
        "title": title,
        "blurb": BLURBS[child.role],
        "port": child.port,
        "state": child.state,
        "fields": [],
        "fleet": [],
        "fleet_note": "",
    }
    if restarts is not None and restarts.restarts(child.name):
        card["fields"].append(
            ["restarts", (f"{restarts.restarts(child.name)} (last exit: {restarts.last_exit(child.name)})")]
        )
    if child.state != "ready":
        return card
    path = "/stats" if child.role == "env" else "/status"
    try:
        response = await client.get(f"{child.url}{path}", timeout=1.0)
        response.raise_for_status()
        fields = shown(child.role, response.content)
        card["fleet"] = fleet_rows(child.role, response.content)
    except httpx.HTTPError as e:
        card["state"] = f"not answering ({type(e).__name__})"
        return card
    except ValidationError as e:
        wrong = e.error_count()
        card["state"] = f"answering something other than its status ({wrong} field{'s' * (wrong != 1)} wrong)"
        return card
    for label, value in fields:
        if isinstance(value, float):
            value = round(value, 3)
        card["fields"].append([label, "—" if value is None else value])
    return card


def freshen_fleet(trainer: dict[str, Any], rollouts: dict[str, dict[str, Any]]) -> None:
    """Give the trainer card's fleet rows (`fleet_rows`) each server's version and state from that server's own card
    where this launcher runs it (the launcher names a server after its child): a heartbeat trails the server's own
    `/status` by up to a beat, and the rollout cards beside the table show the latter. A server whose process is not
    ready shows what the launcher knows of it ("starting", "restarting …") and no version, never its last heartbeat's
    or a new process's v0. Changes `trainer` in place."""
    for row in trainer["fleet"]:
        card = rollouts.get(row[0])
        if card is None:  # a server of the fleet that this launcher does not run: its heartbeat is all there is
            continue
        if card["state"] != "ready":
            row[1], row[4] = "—", card["state"]
        elif (version := dict(card["fields"]).get(VERSION_FIELD)) is not None:
            row[1] = version


def shown(role: str, status: bytes) -> list[tuple[str, Any]]:
    """What a card shows of an app's status (JSON), as (label, value) pairs; the env's, its games by kind
    (`env_fields`). A rollout server's card shows its fleet state ("producing", "waiting for step
    1", …) where it plays for a fleet run: "ready" above it is the process, not what it does.

    Raises:
        ValidationError: `status` is not the app's status message.
    """
    if role == "env":
        return env_fields(_STATS.validate_json(status))
    if role == "rollout":
        rollout = RolloutStatus.model_validate_json(status)
        fleet = [("fleet state", rollout.fleet_state)] if rollout.fleet_state is not None else []
        untrusted = {k: n for k, n in rollout.refused.items() if k.startswith("untrusted")}
        trust = [("weights", "UNAUTHENTICATED (the bucket's, whoever wrote them)")] if not rollout.authenticated else []
        refused = [
            (
                "refused (not signed by the trainer)",
                " · ".join(f"{k.removeprefix('untrusted ')} {n}" for k, n in sorted(untrusted.items())),
            )
        ]
        return [
            (VERSION_FIELD, rollout.version),
            ("versions behind", rollout.lag),
            *trust,
            *fleet,
            ("engine", rollout.engine),
            ("syncs", rollout.syncs),
            *(refused if untrusted else []),
        ]
    if role == "trainer":
        trainer = TrainerStatus.model_validate_json(status)
        training = str(trainer.state)
        if trainer.waiting_for_rollouts:
            training += f", waiting for rollouts ({trainer.groups_ready} of {trainer.groups_needed} groups ready)"
        recent = trainer.recent
        return [
            ("published version", trainer.version or "none yet"),
            ("progress", step_text(trainer.step, trainer.last_step, trainer.step_s)),
            (f"valid guesses (strict), last {WINDOW} steps", trend_text([r.valid_rate for r in recent], percent=True)),
            *example_rows(trainer),
            (f"letters found of 5, last {WINDOW} steps", trend_text([r.letters for r in recent])),
            ("mean reward", trainer.mean_reward),
            ("training", training),
            ("resumed from version", trainer.resumed_from),
            *exam_fields(trainer),
        ]
    return []


def exam_fields(trainer: TrainerStatus) -> list[tuple[str, Any]]:
    """The trainer card's exam rows: the last exam (held-out words, no examples) and its trend."""
    if trainer.exam is None:
        return [("exam", "off (--exam-every 0)")]
    exams = trainer.exams
    rows: list[tuple[str, Any]] = [
        ("last exam (held-out words, no examples)", exam_text(exams[-1] if exams else None)),
        ("exam: own valid words, trend", exam_trend_text(exams)),
    ]
    if refused := refused_exams_text(trainer.exams_refused):
        rows.append(("exam records not read", refused))
    return rows


_STATS = TypeAdapter(list[PlayerStats])


def env_fields(stats: Sequence[PlayerStats]) -> list[tuple[str, Any]]:
    """The env card's rows: the games finished since the env started, the policy's by kind of game (never one count
    of all kinds: a training game is cut after a few moves, a showcase game is played whole), then people's."""
    totals: dict[str, list[int]] = {}
    for s in sorted(stats, key=lambda s: (s.player == HUMAN, list(GameKind).index(s.kind))):
        label = "people's games" if s.player == HUMAN else f"policy's {s.kind} games"
        games_wins = totals.setdefault(label, [0, 0])
        games_wins[0] += s.games
        games_wins[1] += s.wins
    if not totals:
        return [("games finished", "none yet")]
    return [(label, f"{games:,} finished, {wins:,} won") for label, (games, wins) in totals.items()]


def fleet_rows(role: str, status: bytes) -> list[list[Any]]:
    """The trainer card's fleet table: one row per rollout server (id, version, games/min, seen, state, and whether
    it checks the trainer's signature on its weights: `FleetServer.weights`, a warning marked ⚠)."""
    if role != "trainer":
        return []
    return [
        [s.id, s.version, round(s.games_per_min, 1), f"{s.last_seen_s:.0f} s ago", s.state, _weights(s)]
        for s in TrainerStatus.model_validate_json(status).fleet
    ]


def _weights(server: FleetServer) -> str:
    words, warn = server.weights
    return f"⚠ {words}" if warn else words


def fleet_note(children: Sequence[Child], trainer_card: dict[str, Any]) -> str:
    """What the trainer's card says of the fleet when it has no table of heartbeats to show: the rollout servers
    stopping, not started yet, or started with no heartbeat in the bucket yet."""
    if trainer_card["fleet"]:
        return ""
    rollouts = [c.state for c in children if c.role == "rollout"]
    if any(state in ("stopping", "stopped") for state in rollouts):
        return "rollout fleet: stopping"
    if trainer_card["state"] != "ready" or any(state in ("waiting", "starting") for state in rollouts):
        return "rollout fleet: not started yet"
    return "rollout fleet: no heartbeat in the bucket yet (each server writes one every few seconds once it runs)"


def build_app(children: Sequence[Child], bucket: str, restarts: Supervisor | None = None) -> FastAPI:
    """The landing app for these children (their `state` is read live; `restarts` counts the rollout servers'
    restarts)."""
    app = FastAPI(title="delta-sync: all three apps")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return PAGE.replace("{bucket}", html.escape(public_location(bucket)))

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(FAVICON, media_type="image/svg+xml")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/status")
    async def status() -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            cards = await asyncio.gather(*(_app_status(client, c, restarts) for c in children))
        rollouts = {card["name"]: card for card in cards if card["role"] == "rollout"}
        for card in cards:
            if card["role"] == "trainer":
                freshen_fleet(card, rollouts)
                card["fleet_note"] = fleet_note(children, card)
        return {"bucket": public_location(bucket), "apps": list(cards)}

    return app


class LandingServer:
    """uvicorn in a daemon thread; `stop` asks it to exit and waits a bounded time."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        # The launcher owns SIGINT/SIGTERM; uvicorn must not install its own handlers from a thread.
        self._server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]  # uvicorn's, of some versions
        self._thread = threading.Thread(target=self._server.run, name="landing", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start serving; returns once it listens.

        Raises:
            RuntimeError: it did not start within `timeout_s` (e.g. the port is taken).
        """
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.05)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.05)
        if not self._server.started:
            raise RuntimeError("the landing page did not start (is its port taken? choose another with --port)")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask it to exit; wait at most `timeout_s`."""
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)


#: A green Wordle tile: the page's icon (served at /favicon.ico and inlined, so no request 404s).
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="2" '
    'fill="#6aaa64"/><text x="8" y="12.5" font-size="11" font-family="sans-serif" font-weight="700" '
    'fill="#fff" text-anchor="middle">Δ</text></svg>'
)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>delta-sync: Wordle RL, live</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; padding: 0 1rem; color: #222; }
 h1 { margin-bottom: .2rem; } .sub { color: #555; margin-top: 0; }
 .cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(17rem, 1fr)); gap: 1rem; }
 .card { border: 1px solid #ddd; border-radius: .6rem; padding: 1rem; }
 .card h2 { font-size: 1.15rem; margin: 0 0 .3rem; } .card p { color: #555; margin: .2rem 0 .6rem; }
 .state { font-weight: 600; } .state.ready { color: #1a7f37; } .state.other { color: #9a6700; }
 dl { display: grid; grid-template-columns: auto auto; gap: .1rem 1rem; margin: .6rem 0; }
 dt { color: #555; } dd { margin: 0; font-variant-numeric: tabular-nums; }
 a.open { display: inline-block; margin-top: .4rem; } code { background: #f4f4f4; padding: 0 .25rem; }
 .card.wide { grid-column: 1 / -1; }  /* the whole row, whatever the columns: "span 2" made a phone's one column two */
 .scroll { overflow-x: auto; max-width: 100%; }
 table.fleet { border-collapse: collapse; font-size: .85rem; margin-top: .4rem; }
 table.fleet th, table.fleet td { border-bottom: 1px solid #eee; padding: .1rem .4rem; text-align: left; }
</style></head>
<body>
<h1>delta-sync: a model trains on Wordle, live</h1>
<p class="sub">The apps on this machine share one bucket (<code>{bucket}</code>) and nothing else: the trainer
publishes a sparse safetensors delta per step there, each rollout server applies it, plays games against the
environment and hands them back through the bucket.</p>
<div class="cards" id="cards"></div>
<p class="sub" id="updated">Waiting for the first status…</p>
<script>
function card(app) {
  const url = `${location.protocol}//${location.hostname}:${app.port}/`;
  const cls = app.state === "ready" ? "ready" : "other";
  const fields = app.fields.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
  const rows = app.fleet.map(r => `<tr>${r.map(v => `<td>${v}</td>`).join("")}</tr>`).join("");
  const fleet = app.fleet.length ? `<div>rollout fleet (through the bucket):</div>
    <div class="scroll"><table class="fleet" id="fleet"><tr><th>server</th><th>version</th><th>games/min</th>
    <th>seen</th><th>state</th><th>weights</th></tr>${rows}</table></div>`
    : (app.fleet_note ? `<div id="fleet-note">${app.fleet_note}</div>` : "");
  return `<div class="card${app.role === "trainer" ? " wide" : ""}" id="card-${app.name}" data-state="${app.state}">
    <h2><a href="${url}">${app.title}</a></h2><p>${app.blurb}</p>
    <div>status: <span class="state ${cls}">${app.state}</span></div>
    <dl>${fields}</dl>${fleet}<a class="open" href="${url}">open ${url}</a></div>`;
}
async function refresh() {
  try {
    const status = await (await fetch("/api/status")).json();
    document.getElementById("cards").innerHTML = status.apps.map(card).join("");
    // UTC, as the feeds' times
    document.getElementById("updated").textContent = "Updated " + new Date().toISOString().slice(11, 19) + " UTC";
  } catch (e) {
    document.getElementById("updated").textContent = "The launcher is not answering (stopped?)";
  }
}
refresh(); setInterval(refresh, 2000);
</script>
</body></html>
"""
