"""The Gradio UI: a person plays Wordle; beside it, a live feed of the policy's games and the win
rate per weight version. Wiring only: game logic is in the session store, HTML in ``render``."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from dashboard import render
from webguard import client_address
from wire.env import HUMAN, WordleObservation

from .errors import ClientLimitError, ServerFullError, SessionNotFoundError
from .sessions import SessionStore

FEED_SIZE = 8


def build_ui(store: SessionStore, trust_forwarded: bool = False, refresh_s: float = 2.0) -> gr.Blocks:
    """The Blocks app; mount it on the API app (see ``env_space.server``).

    Visitors' games go to the store's public pool, under its per-address cap (the address from the
    proxy's ``X-Forwarded-For`` when ``trust_forwarded``).

    Each visitor's game (its last observation, episode id included) lives in ``gr.State``. A ``gr.Timer``
    polls only the history's finished-games counter; the feed and the plot are redrawn when it moves.
    """

    def show(observation: WordleObservation | None, note: str | None = None) -> tuple:
        rows = observation.rows if observation else []
        return (
            observation,
            render.board_html(rows),
            render.keyboard_html(rows),
            note or render.status_text(observation),
            "",
        )

    def new_game(current: WordleObservation | None, request: gr.Request) -> tuple:
        if current is not None and not current.done:
            store.discard(current.episode_id)
        client = client_address(request.headers, request.client.host if request.client else None, trust_forwarded)
        try:
            return show(store.start(player=HUMAN, max_invalid_moves=None, client=client))
        except (ServerFullError, ClientLimitError) as e:
            return show(None, f"Could not start a game: {e}")

    def guess(text: str, current: WordleObservation | None) -> tuple:
        if current is None or current.done:
            return show(current, "Press **New game** to play again." if current else None)
        try:
            return show(store.step(current.episode_id, text))
        except SessionNotFoundError:
            return show(None, "This game expired while idle. Press **New game**.")

    def draw_feed() -> tuple[str, gr.LinePlot, str, pd.DataFrame]:
        stats = store.history.stats()
        curve = render.win_rate_curve(stats)
        return (
            render.feed_html(store.history.recent(FEED_SIZE, policy_only=True)),
            gr.LinePlot(pd.DataFrame(curve, columns=render.CURVE_HEADERS), sort=[str(v) for v, _ in curve]),
            render.win_rate_note(stats),
            pd.DataFrame(render.stats_rows(stats), columns=render.STATS_HEADERS),
        )

    with gr.Blocks(title="Wordle environment", analytics_enabled=False) as demo:
        game = gr.State(None)
        seen = gr.State(-1)
        gr.Markdown("# Wordle\nPlay the game the policy is learning, and watch it play live.")
        with gr.Row():
            with gr.Column(scale=1):
                gr.Markdown("## Your game")
                board = gr.HTML(render.board_html([]))
                status = gr.Markdown(render.status_text(None), elem_id="wordle-status")
                with gr.Row():
                    box = gr.Textbox(
                        show_label=False,
                        placeholder="Type a 5-letter word, press Enter",
                        max_lines=1,
                        scale=3,
                        elem_id="wordle-input",
                    )
                    send = gr.Button("Guess", variant="primary", scale=1, elem_id="wordle-guess")
                keyboard = gr.HTML(
                    render.keyboard_html([]), js_on_load=render.keyboard_js("wordle-input", "wordle-guess")
                )
                restart = gr.Button("New game", elem_id="wordle-new-game")
            with gr.Column(scale=1):
                gr.Markdown("## Policy games (live)")
                feed = gr.HTML(render.feed_html([]))
                gr.Markdown(render.UNFINISHED_NOTE, elem_id="wordle-unfinished-note")
                gr.Markdown(
                    "## Win rate by weight version\nCounted since this env started: a restart begins "
                    "the counts again (the trainer's curves, kept in the bucket, go on)."
                )
                plot = gr.LinePlot(x="weight version", y="win rate", y_lim=[0, 1], height=240, show_label=False)
                plot_note = gr.Markdown(render.win_rate_note([]), elem_id="wordle-win-note")
                gr.Markdown("## Every player since this env started (newest policy versions first)")
                table = gr.Dataframe(
                    headers=render.STATS_HEADERS, interactive=False, elem_id="wordle-stats", max_height=2000
                )

        outputs = [game, board, keyboard, status, box]
        restart.click(new_game, game, outputs, api_name="new_game")
        demo.load(new_game, game, outputs, api_visibility="private")
        gr.on([box.submit, send.click], guess, [box, game], outputs, api_name="guess")
        timer = gr.Timer(refresh_s)
        timer.tick(lambda: store.history.finished, None, seen, show_progress="hidden", api_visibility="private")
        seen.change(draw_feed, None, [feed, plot, plot_note, table], show_progress="hidden", api_visibility="private")
    return demo
