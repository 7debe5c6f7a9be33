"""The Gradio UI: a person plays Wordle; beside it, a live feed of the policy's games and the win
rate per weight version. Wiring only: game logic is in the session store, HTML in ``render``."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from dashboard import render
from webguard import client_address
from wire.env import HUMAN, GameKind, WordleObservation

from .errors import ClientLimitError, ServerFullError, SessionNotFoundError
from .sessions import SessionStore

FEED_SIZE = 8
#: The feed's choices beside all kinds: the policy's games, one kind at a time (training games flood the rest out).
FEED_KINDS = (GameKind.TRAINING, GameKind.EXAM, GameKind.SHOWCASE, GameKind.MATCH)
ALL_KINDS = "all kinds"


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

    def draw_feed(shown: str) -> tuple[str, gr.LinePlot, str, pd.DataFrame]:
        stats = store.history.stats()
        curve = render.win_rate_curve(stats)
        versions = list(dict.fromkeys(str(v) for v, *_ in curve))  # in order, each once (one point per kind)
        kind = None if shown == ALL_KINDS else GameKind(shown)
        return (
            render.feed_html(store.history.recent(FEED_SIZE, policy_only=True, kind=kind)),
            gr.LinePlot(pd.DataFrame(curve, columns=render.CURVE_HEADERS), sort=versions),
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
                shown = gr.Radio(
                    [ALL_KINDS, *(k.value for k in FEED_KINDS)],
                    value=ALL_KINDS,
                    label="which games",
                    elem_id="wordle-feed-kind",
                )
                feed = gr.HTML(render.feed_html([]), elem_id="wordle-feed")
                gr.Markdown(render.FEED_NOTE, elem_id="wordle-unfinished-note")
                gr.Markdown(
                    "## Win rate by weight version and kind of game\nOne line per kind (training, exam, showcase, "
                    "match: played by different rules, never counted together), since this env started: a restart "
                    "begins the counts again (the trainer's curves, kept in the bucket, go on)."
                )
                plot = gr.LinePlot(
                    x="weight version",
                    y="win rate",
                    color="kind of game",
                    x_label_angle=-90,  # upright: on a phone a run's dozens of versions overlapped side by side
                    y_lim=[0, 1],
                    height=240,
                    show_label=False,
                    elem_id="wordle-win-plot",
                )
                plot_note = gr.Markdown(render.win_rate_note([]), elem_id="wordle-win-note")
                gr.Markdown("## Every player and kind of game since this env started (newest policy versions first)")
                table = gr.Dataframe(
                    headers=render.STATS_HEADERS, interactive=False, elem_id="wordle-stats", max_height=2000
                )

        outputs = [game, board, keyboard, status, box]
        restart.click(new_game, game, outputs, api_name="new_game")
        demo.load(new_game, game, outputs, api_visibility="private")
        gr.on([box.submit, send.click], guess, [box, game], outputs, api_name="guess")
        timer = gr.Timer(refresh_s)
        timer.tick(lambda: store.history.finished, None, seen, show_progress="hidden", api_visibility="private")
        drawn = [feed, plot, plot_note, table]
        seen.change(draw_feed, shown, drawn, show_progress="hidden", api_visibility="private")
        shown.change(draw_feed, shown, drawn, show_progress="hidden", api_visibility="private")
    return demo
