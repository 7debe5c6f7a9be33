"""The trainer Space's Gradio UI: read-only for visitors; start/pause/stop behind the owner's token.

No business logic here: it reads `TrainingSession` and draws with `dashboard`'s figures and boards
(whose tiles need `dashboard.render.CSS`, in this module's `CSS`, passed by `server.build_app`). A timer
ticks the cheap part (the status line, and the committed version into per-visitor `gr.State`);
the plots are redrawn only when that version or the step count changed.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import gradio as gr

from dashboard import render, sparsity
from dashboard.exam import exam_figure, exam_text, refused_exams_text
from dashboard.examples import example_rows
from dashboard.figures import Metric, Series, learning_curves, line_curves, payload_curves, sparsity_heatmap
from dashboard.games import feed_html
from dashboard.labels import GLOSSARY, counted, density_note, lora_label, public_location, published_state
from dashboard.traffic import traffic_text
from dashboard.trend import step_text
from wire.fleet import Refusal, ServerState
from wire.trainer import FleetServer, Staleness, StepRecord, TrainerState, TrainerStatus

from .session import AccessDenied, TrainingSession

#: The page's CSS: the boards' (`dashboard.render`), and the fleet table's cells without the page's wide padding, so
#: that its columns fit the page's column at 1280 px.
CSS = render.CSS + "\n#trainer-fleet .fleet-box th, #trainer-fleet .fleet-box td { padding: 4px 8px; }\n"
TICK_S = 2.0
FEED_SIZE = 8
_RATE_RANGE = (-0.05, 1.05)  # 0 % and 100 % points stay inside the panel
_LETTERS_RANGE = (-0.1, 5.1)


def cut_games_note(max_turns: int) -> str:
    """Why the training games read "unfinished" and the win rate sits near 0."""
    return (
        f"Training games are cut after **{max_turns} moves** (`--max-turns`; Wordle allows 6) and then read "
        '"unfinished": every move generates over the whole conversation again, so on a CPU shorter games '
        "give more steps per minute, and the strict valid-guess rate and letters found are what a small "
        "model learns first. A win needs the word within those moves, so the win rate stays near 0 "
        'until the policy plays well. A word marked "env\'s example" is the example guess the '
        "env's message offered before that move (never the secret): a small policy learns the format by "
        "copying it, not its own words."
    )


def status_markdown(status: TrainerStatus) -> str:
    """One status block from `session.status()`."""
    stale = status.staleness or Staleness()
    reward = status.mean_reward
    steps = step_text(status.step, status.last_step, status.step_s).replace("step ", "step **", 1)
    letters = "—" if status.letters is None else f"{status.letters:.2f}"
    lines = [
        f"**{status.state}** · version **{status.version}** · {steps}**",
        (
            f"mean reward {'—' if reward is None else f'{reward:.3f}'} · win rate {_percent(status.win_rate)} · valid "
            f"guesses {_percent(status.valid_rate)} · letters found {letters} of 5 · last step took "
            f"{'—' if status.step_s is None else f'{status.step_s:.1f} s'}"
        ),
        _staleness_line(status, stale),
        f"training on **{status.device}** · bucket: `{html.escape(public_location(status.bucket))}` · "
        + (
            f"games from the rollout fleet through the bucket (run `{status.run_id}`)"
            if status.mode == "fleet"
            else f"games from the rollout at {status.rollout_url}"
        ),
    ]
    lines.append(_exam_line(status))
    if status.lora is not None:
        lora = status.lora
        trainable = (
            ""
            if status.trainable is None or not status.parameters
            else f" · {status.trainable:,} trainable parameters of {status.parameters:,} "
            f"({100 * status.trainable / status.parameters:.2f} %)"
        )
        lines.append(f"**{html.escape(lora_label(lora.sync, lora.r, lora.alpha, lora.targets))}**{trainable}")
    if status.waiting_for_rollouts:
        lines.insert(1, f"**waiting for rollouts**: {status.groups_ready} of {status.groups_needed} groups ready")
    if status.bucket_traffic is not None:
        lines.append(html.escape(traffic_text(status.bucket_traffic)))
    if status.error:
        lines.append(f"**error:** {html.escape(status.error)}")
    rollout_error = status.rollout_error
    if rollout_error and not (status.error and rollout_error.split(" ", 1)[-1] in status.error):  # said just above
        failing = status.rollout_failing
        if not failing:
            state = "recovered"
        elif status.state == TrainerState.STOPPED:
            state = "the run stopped"
        else:
            state = f"retrying ({failing} failed in a row)"
        lines.append(f"**last rollout error** ({state}): {html.escape(rollout_error)}")
    return "\n\n".join(lines)


def _exam_line(status: TrainerStatus) -> str:
    """The two figures of the examples in training games (`dashboard.examples`, as the landing page words them), and
    the last exam."""
    examples = " · ".join(f"{name}: {value}" for name, value in example_rows(status))
    if status.exam is None:
        return f"{examples} · no exams (--exam-every 0)"
    last = status.exams[-1] if status.exams else None
    line = f"{examples} · " + (f"last exam {exam_text(last)}" if last else "no exam yet")
    refused = refused_exams_text(status.exams_refused)
    return f"{line} · {refused}" if refused else line


#: Beside the exam curves: what the exam is, and how to read it.
EXAM_NOTE = (
    "**The exam** tells whether the policy plays by itself. Every few versions a rollout server plays "
    "held-out secret words (never used in training) with the env's examples off, and the games are never "
    "trained on. The headline counts moves that scored a word **of the policy's own**: not shown in any "
    "message before it (an example, or a word of the instructions such as GUESS). The untrained policy's "
    "exam and a player that copies every example (examples on) are the reference lines."
)


def exam_panel(session: TrainingSession) -> None:
    """The exam curves and their note, redrawn when a new exam comes in (call inside the page's Blocks)."""
    watch = session.exams
    records = watch.records() if watch is not None else []
    plot = gr.Plot(exam_figure(records), label="exam", show_label=False, elem_id="trainer-exam")
    gr.Markdown(EXAM_NOTE, elem_id="trainer-exam-note")
    seen = gr.State([(r.version, r.at) for r in records])

    def tick(last: Any) -> tuple:
        now = watch.records() if watch is not None else []
        key = [(r.version, r.at) for r in now]
        return (gr.skip(), last) if key == last else (exam_figure(now), key)

    gr.Timer(TICK_S).tick(tick, seen, [plot, seen], show_progress="hidden", queue=False)


def _staleness_line(status: TrainerStatus, stale: Staleness) -> str:
    """How stale the games trained on were, and what was done with the rest."""
    if status.mode == "fleet":
        return (
            f"staleness bound {status.max_staleness} versions: {stale.games} games trained on (most "
            f"{counted(stale.max_seen, 'version')} behind), {stale.dropped} dropped as too stale, "
            f"{_refusals(stale.refused, status.groups_refused, 'group')}; "
            f"{_refusals(sum(status.heartbeats_refused.values()), status.heartbeats_refused, 'heartbeat file')}; "
            f"{_refusals(sum(status.exams_refused.values()), status.exams_refused, 'exam file')}"
            f" · files {'signed (rollout token)' if status.signed else 'unsigned (no rollout token)'}"
        )
    return (
        f"staleness bound {status.max_staleness} versions: {stale.games} games trained on, "
        f"{stale.replayed} replayed, {stale.dropped} dropped"
    )


#: Refusal reasons that read as a fault without a word more.
GLOSSES: dict[str, str] = {
    Refusal.ANOTHER_RUN: "from an earlier run, left in the bucket by the last start: expected after a restart"
}


def _refusals(total: int, by_reason: dict[str, int], what: str) -> str:
    """ "3 groups refused (2 torn or corrupt, 1 token id out of the vocabulary)", or "no groups refused"
    (`what` in the singular)."""
    if not total:
        return f"no {what}s refused"
    reasons = ", ".join(
        f"{n} {html.escape(GLOSSES.get(reason, reason))}"
        for reason, n in sorted(by_reason.items(), key=lambda r: -r[1])
    )
    return f"{total} {what}{'s' if total > 1 else ''} refused ({reasons})"


def weights_cell(server: FleetServer) -> str:
    """The fleet table's weights cell (`FleetServer.weights`): a warning in bold."""
    words, warn = server.weights
    return f"<td><b>⚠ {html.escape(words)}</b></td>" if warn else f"<td>{html.escape(words)}</td>"


def fleet_warning(servers: Sequence[FleetServer]) -> str:
    """What the table's warnings mean, under it: servers that follow the bucket unauthenticated, or trust another key
    ("" when none does)."""
    loose = [s.id for s in servers if s.authenticated is False]
    other = [s.id for s in servers if s.authenticated and s.trusts_trainer is False]
    said = []
    if loose:
        said.append(
            f"⚠ Following the bucket UNAUTHENTICATED (--unauthenticated): {', '.join(loose)}. The weights and run "
            "settings they play with are whatever the bucket holds, whoever wrote them, and their games train this "
            "model."
        )
    if other:
        said.append(
            f"⚠ Trusting another key than this trainer's: {', '.join(other)}. They refuse its weights and run "
            "settings (give them this trainer's key: --trusted-key)."
        )
    return "".join(f"<p>{html.escape(line)}</p>" for line in said)


def fleet_html(servers: Sequence[FleetServer]) -> str:
    """The rollout servers as a table: what each serves, how fast it plays, when it was last heard of, and whether it
    checks the trainer's signature on what it plays with."""
    if not servers:
        return "<p>No rollout server has written a heartbeat to the bucket yet.</p>"
    errors = any(s.last_error for s in servers)  # the last error's column only while a server has one
    rows = "".join(  # a starting server has not read the bucket yet: no version to show
        f"<tr><td>{html.escape(s.id)}</td><td>{'—' if s.state == ServerState.STARTING else s.version}</td>"
        f"<td>{s.games_per_min:.1f}</td>"
        f"<td>{s.last_seen_s:.0f} s ago</td><td>{html.escape(s.state)}</td><td>{100 * s.idle_share:.0f}%</td>"
        f"<td>{s.groups_written}</td>{weights_cell(s)}"
        + (f"<td style='white-space:normal;min-width:16em'>{html.escape(s.last_error or '')}</td>" if errors else "")
        + "</tr>"
        for s in servers
    )
    # Cells wrap at spaces, so every column shows in the page's column at 1280 px (on one line each, the last one was
    # cut off there); in a box that scrolls sideways where even that does not fit (a phone, 390 px). The last error
    # wraps in a column wide enough to keep the rows a few lines high.
    return (
        "<div class='fleet-box' style='overflow-x:auto;max-width:100%'><table style='font-size:.85em;width:100%'>"
        "<tr><th>server</th>"
        "<th>version</th><th>games/min</th><th>last seen</th><th>state</th>"
        f"<th>idle</th><th>groups</th><th>weights</th>{'<th>last error</th>' if errors else ''}</tr>{rows}</table>"
        f"</div>{fleet_warning(servers)}"
    )


#: The off-policy figure's staleness series, drawn against its own axis (versions, not a weight).
STALENESS_SERIES = "mean staleness (versions)"


def straddle_text(records: Sequence[StepRecord]) -> str:
    """How many replies trained on straddled two weight versions, and where each token's version came from."""
    known = [r.versions_reported for r in records if r.versions_reported is not None]
    if not known:
        return "token versions: none recorded yet"
    count = sum(r.straddled for r in records)
    if all(known):
        how = "each token's version as the servers' vLLM reported it"
    elif any(known):
        how = "each token's version where the server reported it, else per reply"
    else:
        how = "versions per reply: the servers report none per token (they apply new weights between replies)"
    return f"replies that straddled two weight versions: {count} ({how})"


def offpolicy_figure(records: Sequence[StepRecord]) -> Any:
    """Per step: the importance weights of its model tokens (mean, min, max) and its games' mean staleness; the title
    says how many replies straddled two weight versions (`straddle_text`)."""
    steps = [r.step for r in records]

    def mean_staleness(r: StepRecord) -> float | None:
        games = sum(r.staleness.values())
        return sum(int(k) * n for k, n in r.staleness.items()) / games if games else None

    series = [
        Series("weight mean", steps, [r.ratio_mean for r in records]),
        Series("weight min", steps, [r.ratio_min for r in records], "dot"),
        Series("weight max", steps, [r.ratio_max for r in records], "dot"),
        Series(STALENESS_SERIES, steps, [mean_staleness(r) for r in records], "dash"),
    ]
    figure = line_curves(
        series,
        "Off-policy correction<br><sup>importance weights (current / sampler, truncated), and staleness; "
        f"{straddle_text(records)}</sup>",
        whole_x=True,
    )
    # Two quantities, two axes: a weight is a ratio around 1, staleness a count of versions.
    figure.update_traces(yaxis="y2", selector={"name": STALENESS_SERIES})
    figure.update_layout(
        yaxis={"title": {"text": "importance weight"}},
        yaxis2={
            "title": {"text": "staleness (versions)"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
    )
    return figure


#: The learning curves' title: what the training games' scores are (games with the env's example in most messages,
#: whose valid guesses can be copies), and where to look for what the policy does alone.
LEARNING_TITLE = (
    "Training games<br><sup>examples shown: a valid guess may be a copy; the exam below plays without</sup>"
)
#: The panel of the share of the training games' messages that showed the env's example (`dashboard.examples`).
EXAMPLES_PANEL = "examples shown (share of messages)"

#: The examples panel's second line: what the run's schedule gave the same games (the shown share is a draw around it).
SCHEDULE_SERIES = "the schedule, for those games"

#: The x axes the learning curves offer (the radio's choices).
X_AXES = ("step", "wall time (minutes)")


def learning_figure(records: Sequence[StepRecord], x_axis: str = X_AXES[0]) -> Any:
    """Reward, win rate, strict valid-guess rate, letters found and the share of messages that showed the env's
    example per step, raw and smoothed, against steps or against minutes since the first step began (all from the
    games trained on)."""
    if x_axis == X_AXES[0] or not records:
        x: list[float] = [r.step for r in records]
    else:
        start = records[0].at - records[0].step_s
        x = [(r.at - start) / 60 for r in records]
    metrics = [
        Metric("mean reward", [r.reward for r in records]),
        Metric("win rate", [r.win_rate for r in records], _RATE_RANGE),
        Metric("valid-guess rate (strict)", [r.valid_rate for r in records], _RATE_RANGE),
        Metric("letters found (of 5)", [r.letters for r in records], _LETTERS_RANGE),
        Metric(
            EXAMPLES_PANEL,
            [r.examples_shown for r in records],
            _RATE_RANGE,
            reference=Series(SCHEDULE_SERIES, x, [r.examples_scheduled for r in records], "dash"),
        ),
    ]
    return learning_curves(x, metrics, x_title=x_axis, title=LEARNING_TITLE, whole_x=x_axis == X_AXES[0])


def figures(session: TrainingSession, x_axis: str = X_AXES[0]) -> tuple[Any, Any, Any, Any]:
    """Learning curves, payload curves, the latest delta's sparsity heatmap and the off-policy figure (a LoRA run's
    titles say what its versions hold: the adapter's tensors or the merged weights)."""
    records = list(session.records)
    learning = learning_figure(records, x_axis)
    history = session.history()
    payloads = history.payloads
    header = session.payloads.latest_header if session.payloads is not None else None
    config = session.config
    what = published_state(
        config.lora_sync if config.lora_r else None, [t.dtype for t in header.tensors] if header else ()
    )
    payload = payload_curves(
        [p.version for p in payloads],
        [p.delta_bytes for p in payloads],
        [p.raw_bytes for p in payloads],
        payloads[-1].dense_bytes if payloads else None,
        codec=config.codec or "default codec (ctx)",
        anchors=[(a.version, a.bytes) for a in history.anchors],
        title="Bytes published per step" + (f": {what}" if what else ""),
        dense="whole adapter" if config.lora_r and config.lora_sync == "adapter" else "dense model",
    )
    heatmap = sparsity_heatmap(
        sparsity(header) if header else None, side=f"published ({what})" if what else "published"
    )
    return learning, payload, heatmap, offpolicy_figure(records)


def build_ui(session: TrainingSession) -> gr.Blocks:
    """The Blocks app (mounted by `server.build_app`)."""
    with gr.Blocks(title="Delta trainer", analytics_enabled=False) as demo:
        gr.Markdown("# Trainer: GRPO on Wordle, a sparse delta published after every step")
        status = gr.Markdown(status_markdown(session.status()))
        seen = gr.State(None)
        with gr.Row():
            with gr.Column(scale=2):
                x_axis = gr.Radio(list(X_AXES), value=X_AXES[0], label="x axis", elem_id="trainer-x-axis")
                learning_plot = gr.Plot(label="learning", show_label=False, elem_id="trainer-learning")
                exam_panel(session)
            with gr.Column(scale=1):
                gr.Markdown("### The policy's latest games (trained on)")
                gr.Markdown(cut_games_note(session.config.max_turns), elem_id="trainer-cut-note")
                games = gr.HTML(feed_html(session.recent_games(FEED_SIZE)), elem_id="trainer-games")
        with gr.Row():
            payload_plot = gr.Plot(label="payload", show_label=False, elem_id="trainer-payload")
            with gr.Column():
                heatmap_plot = gr.Plot(label="sparsity", show_label=False, elem_id="trainer-heatmap")
                density = gr.Markdown(density_note(None), elem_id="trainer-density-note")
        with gr.Row():
            with gr.Column(scale=1):
                gr.Markdown("### Rollout fleet (heartbeats in the bucket)")
                fleet = gr.HTML(fleet_html(session.status().fleet), elem_id="trainer-fleet")
            with gr.Column(scale=1):
                offpolicy_plot = gr.Plot(label="off-policy", show_label=False, elem_id="trainer-offpolicy")
        with gr.Accordion("What the words mean", open=False):
            gr.Markdown(GLOSSARY, elem_id="trainer-glossary")
        with gr.Accordion("Owner controls", open=False):
            token = gr.Textbox(label="owner token", type="password")
            with gr.Row():
                buttons = {a: gr.Button(a) for a in ("start", "pause", "stop")}
            message = gr.Markdown()

        def tick_status() -> tuple[str, str]:
            """The status line and the fleet table: cheap, so on their own timer, never behind the figures."""
            now = session.status()
            return status_markdown(now), fleet_html(now.fleet)

        def tick(last: Any, axis: str) -> tuple:
            current = (session.version, len(session.records))  # a new version or step record: draw again
            if current == last:
                return last, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            learning, payload, heatmap, offpolicy = figures(session, axis)
            header = session.payloads.latest_header if session.payloads is not None else None
            note = density_note(sparsity(header).density if header is not None else None)
            return current, learning, payload, heatmap, offpolicy, feed_html(session.recent_games(FEED_SIZE)), note

        outputs = [seen, learning_plot, payload_plot, heatmap_plot, offpolicy_plot, games, density]
        gr.Timer(TICK_S).tick(tick_status, None, [status, fleet], show_progress="hidden", queue=False)
        gr.Timer(TICK_S).tick(tick, [seen, x_axis], outputs, show_progress="hidden", queue=False)
        demo.load(tick_status, None, [status, fleet], show_progress="hidden")
        demo.load(tick, [seen, x_axis], outputs, show_progress="hidden")
        x_axis.change(
            lambda axis: learning_figure(list(session.records), axis),
            x_axis,
            learning_plot,
            show_progress="hidden",
            api_visibility="private",
        )

        for action, button in buttons.items():

            def press(tok: str, action: str = action) -> str:
                try:
                    return f"{action}: now **{session.control(action, tok)}**"
                except AccessDenied as e:
                    return f"refused: {e}"

            button.click(press, token, message, api_visibility="private")
    return demo


def _percent(rate: float | None) -> str:
    return "—" if rate is None else f"{100 * rate:.0f}%"
