"""The trainer Space's Gradio UI: read-only for visitors; start/pause/stop behind the owner's token.

No business logic here: it reads `TrainingSession` and draws with `dashboard`'s figures and boards
(whose tiles need `env_space.render.CSS`, passed by `server.build_app`). A timer
ticks the cheap part (the status line, and the committed version into per-visitor `gr.State`);
the plots are redrawn only when that version or the step count changed.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from dashboard import sparsity
from dashboard.figures import payload_curves, reward_curves, sparsity_heatmap
from dashboard.games import feed_html

from .session import AccessDenied, TrainingSession

TICK_S = 2.0


def status_markdown(status: dict[str, Any]) -> str:
    """One status block from `session.status()`."""
    stale = status.get("staleness") or {}
    reward = status["mean_reward"]
    win = status["win_rate"]
    lines = [
        f"**{status['state']}** · version **{status['version']}** · step **{status['step']}** / {status['max_steps']}",
        (f"mean reward {'-' if reward is None else f'{reward:.3f}'} · win rate "
         f"{'-' if win is None else f'{100 * win:.0f}%'} · step {status['step_s'] or 0:.1f} s"),
        (f"staleness bound {status['max_staleness']} versions: {stale.get('games', 0)} games trained on, "
         f"{stale.get('replayed', 0)} replayed, {stale.get('dropped', 0)} dropped"),
        f"training on **{status.get('device')}** · bucket `{status['bucket']}` · rollout {status['rollout_url']}",
    ]
    if status.get("error"):
        lines.append(f"**error:** {status['error']}")
    return "\n\n".join(lines)


def figures(session: TrainingSession) -> tuple[Any, Any, Any]:
    """Reward/win-rate curves, payload curves and the latest delta's sparsity heatmap."""
    records = list(session.records)
    steps = [r.step for r in records]
    rewards = reward_curves(steps, [r.reward for r in records], [r.win_rate for r in records])
    payloads = list(session.payloads.records) if session.payloads is not None else []
    payload = payload_curves([p.version for p in payloads], [p.delta_bytes for p in payloads],
                             [p.raw_bytes for p in payloads], payloads[-1].dense_bytes if payloads else None,
                             codec=session.config.codec or "default codec (ctx)")
    payload.update_xaxes(title_text="version")
    header = session.payloads.latest_header if session.payloads is not None else None
    title = f"Changed elements per layer and kind, version {header.version}" if header else None
    heatmap = sparsity_heatmap(sparsity(header) if header else None, title)
    return rewards, payload, heatmap


def build_ui(session: TrainingSession) -> gr.Blocks:
    """The Blocks app (mounted by `server.build_app`)."""
    with gr.Blocks(title="Delta trainer") as demo:
        gr.Markdown("# Trainer: GRPO on Wordle, a sparse delta published after every step")
        status = gr.Markdown(status_markdown(session.status()))
        seen = gr.State(None)
        with gr.Row():
            reward_plot = gr.Plot(label="reward")
            payload_plot = gr.Plot(label="payload")
        heatmap_plot = gr.Plot(label="sparsity")
        gr.Markdown("### Recent games of the policy")
        games = gr.HTML(feed_html(session.recent_games()))
        with gr.Accordion("Owner controls", open=False):
            token = gr.Textbox(label="owner token", type="password")
            with gr.Row():
                buttons = {a: gr.Button(a) for a in ("start", "pause", "stop")}
            message = gr.Markdown()

        def tick(last: Any) -> tuple:
            current = (session.version, session.steps)
            text = status_markdown(session.status())
            if current == last:
                return text, last, gr.skip(), gr.skip(), gr.skip(), gr.skip()
            rewards, payload, heatmap = figures(session)
            return text, current, rewards, payload, heatmap, feed_html(session.recent_games())

        outputs = [status, seen, reward_plot, payload_plot, heatmap_plot, games]
        gr.Timer(TICK_S).tick(tick, seen, outputs, show_progress="hidden", queue=False)
        demo.load(tick, seen, outputs, show_progress="hidden")

        for action, button in buttons.items():
            def press(tok: str, action: str = action) -> str:
                try:
                    return f"{action}: now **{session.control(action, tok)}**"
                except AccessDenied as e:
                    return f"refused: {e}"

            button.click(press, token, message, api_visibility="private")
    return demo
