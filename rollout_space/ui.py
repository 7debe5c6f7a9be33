"""The rollout Space's Gradio UI: what it serves, how weights reach it, the policy playing, and a
person playing the policy on the same word.

Wiring only: numbers come from :class:`~rollout_space.service.RolloutService`, figures and boards from
``dashboard``, the person's board from ``dashboard.render``. Mount it with :func:`mount_ui`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gradio as gr
from fastapi import FastAPI

from dashboard import games, render, sparsity
from dashboard.exam import opponent_text
from dashboard.figures import sparsity_heatmap, sync_timeline
from dashboard.labels import GLOSSARY, counted, density_note, lora_label, public_location
from dashboard.mount import mount_ui as _mount
from dashboard.traffic import traffic_text
from webguard import client_address
from wire.env import GameKind
from wire.errors import RolloutError
from wire.rollout import RolloutStatus, Trajectory

from .engines.errors import EngineError
from .games import GameSpec, PlayParams
from .public import PublicLimitError, PublicPlay
from .service import RolloutService
from .versus import Match, Opponent, PrivateGames, VersusError, VersusView, examples_sentence

CSS = (
    render.CSS
    + """
#rollout-status p { margin: 2px 0; }
.wordle-board[data-testid=policy-board] .wordle-tile:empty { min-height: 52px; }
"""
)
FEED_SIZE = 8
#: Tokens per policy reply in games the UI starts (the service's own cap may be lower).
REPLY_TOKENS = 48


#: Said beside the match: its turns take the engine between the trainer's (`priority.py`), and on a
#: small machine every one of them delays a training step.
MATCH_SLOWS_TRAINING = (
    "*While a match is played, the policy's moves use the same engine as the trainer's "
    "games, so training steps take longer (seen on a 2-core machine: about 52 s a step "
    "became about 89 s while a person played).*"
)


def status_markdown(status: RolloutStatus) -> str:
    """The status lines: version served, lag behind the trainer, engine, model, last error."""
    latest = status.latest_version
    if latest is None:
        lag = "the bucket has no version yet"
    elif status.lag:
        lag = f"trainer's latest **v{latest}**, {status.lag} behind"
    else:
        lag = f"up to date with the trainer (v{latest})"
    engine, device = html.escape(status.engine), html.escape(status.device)
    model = html.escape(public_location(status.model))
    counts = f"{counted(status.syncs, 'sync')} · {counted(status.tokens_served, 'token')} served"
    lines = [
        f"### Serving **v{status.version}** · {lag}",
        f"engine **{engine}** on **{device}** · model: `{model}` · {counts}",
        trust_markdown(status),
    ]
    if status.server_id:
        run = f" for run `{html.escape(status.fleet_run)}`" if status.fleet_run else ""
        lines.append(
            f"fleet server `{html.escape(status.server_id)}`: **{html.escape(status.fleet_state or '')}**{run} · "
            f"{status.groups_written} game groups handed in through the bucket"
        )
    if status.lora is not None:
        lora = status.lora
        lines.append(f"following {html.escape(lora_label(lora.sync, lora.r, lora.alpha, lora.targets))}")
    if status.adapters:
        lines.append(f"serves {html.escape(status.adapters)}")
    if status.versions_reported is not None:
        lines.append(token_versions_text(status))
    if status.refused:
        lines.append("refused: " + " · ".join(f"{html.escape(kind)} {n}" for kind, n in sorted(status.refused.items())))
    if status.last_refusal:
        lines.append(f"**last refused:** {html.escape(status.last_refusal)}")
    if status.note:
        lines.append(f"note: {html.escape(status.note)}")
    error = status.last_error
    lines.append(f"**last error:** {html.escape(error)}" if error else "no errors")
    if status.bucket_traffic is not None:
        lines.append(html.escape(traffic_text(status.bucket_traffic)))
    return "\n\n".join(lines)


def token_versions_text(status: RolloutStatus) -> str:
    """How many replies straddled two weight versions, and whether the engine says which version sampled each token."""
    if status.versions_reported:
        how = "each token's weight version as vLLM reported it"
    else:
        how = "weight versions per reply: the engine reports none per token (it applies new weights between replies)"
    return f"{counted(status.straddled, 'reply', 'replies')} straddled two weight versions ({how})"


def trust_markdown(status: RolloutStatus) -> str:
    """Whose weights are served: checked with the trainer's key, or (said loudly) not checked at all."""
    if not status.authenticated:
        return (
            "**⚠ unauthenticated weights:** this server follows its bucket without checking the trainer's "
            "signature; whoever can write to the bucket decides what it serves"
        )
    return f"weights and run settings checked with the {html.escape(status.trust)}"


def build_ui(
    service: RolloutService,
    refresh_s: float = 2.0,
    feed_size: int = FEED_SIZE,
    trust_forwarded: bool = False,
    public: PublicPlay | None = None,
) -> gr.Blocks:
    """The Blocks app of the rollout Space.

    A ``gr.Timer`` ticks every ``refresh_s`` seconds: it redraws the status line and checks a cheap key
    (version served, latest game, match games); the figures and the feed are redrawn only when the key
    moves. Each visitor's match lives in ``gr.State``; its policy game runs on a one-worker executor
    shared by the visitors of this app, whose queue ``public`` bounds (per visitor address, taken from
    the proxy's ``X-Forwarded-For`` when ``trust_forwarded``, and in all). Visitors' games wait for the
    trainer's requests before each turn.
    """
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="versus-policy")
    params = PlayParams(max_tokens=min(REPLY_TOKENS, service.limits.max_tokens))
    public = public or PublicPlay()

    def visitor(request: gr.Request | None) -> str:
        if request is None:
            return "unknown"
        return client_address(request.headers, request.client.host if request.client else None, trust_forwarded)

    def play_match_game(seed: int, progress: Any) -> Trajectory:
        # the game goes on in this thread: the match gets a copy of it after each turn
        [game] = service.play(
            [GameSpec(seed=seed, kind=GameKind.MATCH)],
            params,
            on_turn=lambda live: progress(live[0].model_copy(deep=True)),
            public=True,
        )
        return game

    private = PrivateGames(play_match_game)
    shapes: dict[str, tuple[int, ...]] = {}

    def state_shapes() -> dict[str, tuple[int, ...]]:
        if not shapes:
            shapes.update({n: tuple(t.shape) for n, t in service.engine.state.items()})
        return shapes

    def tick() -> tuple[str, tuple]:
        status = service.status()
        newest = service.recent_games(1)
        key = (status.version, status.syncs, newest[0].episode_id if newest else None, private.changes)
        return status_markdown(status), key

    def draw() -> tuple:
        header = service.last_delta()
        grid = sparsity(header, state_shapes()) if header is not None else None
        shown = private.visible(service.recent_games(feed_size))
        feed = gr.skip() if shown is None else games.feed_html(shown, kinds=service.kinds())
        note = density_note(grid.density if grid is not None else None)
        return sparsity_heatmap(grid), sync_timeline(service.syncs()), feed, note

    def play_one(request: gr.Request) -> str:
        client = visitor(request)
        try:
            public.acquire(client)
        except PublicLimitError as e:
            return f"<p>{html.escape(str(e))}</p>"
        try:
            [game] = service.play([GameSpec(kind=GameKind.SHOWCASE)], params, public=True)
        except (RolloutError, EngineError) as e:  # shown to the visitor; the Space keeps serving
            return f"<p>The policy could not play: {html.escape(str(e))}</p>"
        finally:
            public.release(client)
        return "<p><b>The game you started:</b></p>" + games.feed_html(
            [game], testid="played-game", kinds={game.episode_id: GameKind.SHOWCASE}
        )

    def show(match: Match | None, note: str | None = None) -> tuple:
        view = match.view() if match is not None else _empty_view(note, next_opponent())
        return (
            match,
            view.human_board,
            view.keyboard,
            note or view.human_status,
            view.policy_board,
            view.policy_status,
            view.opponent,
            "",
        )

    def new_match(current: Match | None, request: gr.Request) -> tuple:
        if current is not None:
            current.close()  # its queued policy game is dropped, a running one stops at its next turn
        if service.env is None:
            return show(None, "This rollout server has no env Space (start it with --env-url).")
        client = visitor(request)
        try:
            public.acquire(client)
        except PublicLimitError as e:
            return show(None, f"Could not start a match: {html.escape(str(e))}")
        try:
            match = Match(service.env, private.play, executor, opponent_now())
        except VersusError as e:
            public.release(client)
            return show(None, f"Could not start a match: {html.escape(str(e))}")
        match.policy.add_done_callback(lambda _: public.release(client))
        return show(match)

    def guess(text: str, match: Match | None) -> tuple:
        if match is None:
            return show(None)
        if match.human.done:
            return show(match, "Press **New match** to play again.")
        try:
            match.guess(text.strip())
        except VersusError as e:
            return show(match, f"The env did not take the guess: {html.escape(str(e))}")
        return show(match)

    def opponent_now() -> Opponent:
        """The opponent as a match starting now meets it (fixed for that match)."""
        version = service.engine.version
        exam = service.examiner.latest(version) if service.examiner is not None else None
        return Opponent(version, exam, params.examples, params.max_turns)

    def next_opponent() -> str:
        """Above the boards while no match is on: who a match started now would play."""
        opponent = opponent_now()
        activity = service.examiner.activity() if service.examiner is not None else None
        who = f"**policy v{opponent.version}** (served now; a match names the version that plays its moves)"
        return opponent_text(who, opponent.exam, activity) + " " + examples_sentence(opponent.examples)

    def refresh_policy(match: Match | None) -> tuple:
        if match is None:
            return gr.skip(), gr.skip(), next_opponent()
        view = match.view()
        return view.policy_board, view.policy_status, view.opponent

    with gr.Blocks(title="Rollout server", analytics_enabled=False) as demo:
        seen = gr.State(None)
        match = gr.State(None, delete_callback=lambda m: m.close() if m is not None else None)
        gr.Markdown("# Rollout server\nThe latest policy, kept current from the trainer's bucket by sparse deltas.")
        status = gr.Markdown(status_markdown(service.status()), elem_id="rollout-status")
        with gr.Row():
            timeline = gr.Plot(sync_timeline([]), show_label=False, elem_id="rollout-timeline")
            heatmap = gr.Plot(sparsity_heatmap(None), show_label=False, elem_id="rollout-heatmap")
        density = gr.Markdown(density_note(None), elem_id="rollout-density-note")
        with gr.Accordion("What the words mean", open=False):
            gr.Markdown(GLOSSARY, elem_id="rollout-glossary")
        with gr.Row():
            # The match first: on a phone the columns stack, and a visitor who came to play should not scroll
            # past the whole live feed to find it.
            with gr.Column(scale=2):
                gr.Markdown(
                    "## Play against the policy\nYou and the policy get the same secret word. You see "
                    "the colours of its rows as you play yours, and its words once your game is over. "
                    "Type a word and press Enter."
                )
                gr.Markdown(MATCH_SLOWS_TRAINING, elem_id="versus-slows-training")
                exam_note = gr.Markdown(next_opponent(), elem_id="versus-exam")
                with gr.Row():
                    with gr.Column():
                        gr.Markdown("### You")
                        human_board = gr.HTML(render.board_html([]))
                        human_status = gr.Markdown("Press **New match** to start.", elem_id="versus-status")
                        with gr.Row():
                            box = gr.Textbox(
                                show_label=False,
                                placeholder="5-letter word",
                                max_lines=1,
                                scale=3,
                                elem_id="versus-input",
                            )
                            send = gr.Button("Guess", variant="primary", scale=1, elem_id="versus-guess")
                        keyboard = gr.HTML(
                            render.keyboard_html([]), js_on_load=render.keyboard_js("versus-input", "versus-guess")
                        )
                    with gr.Column():
                        gr.Markdown("### The policy")
                        policy_board = gr.HTML(games.board_html(None), elem_id="versus-policy")
                        policy_status = gr.Markdown("", elem_id="versus-policy-status")
                restart = gr.Button("New match", elem_id="versus-new-match")
            with gr.Column(scale=1):
                gr.Markdown("## The policy playing (live)")
                feed = gr.HTML(games.feed_html([]), elem_id="rollout-feed")
                play = gr.Button("Let the policy play a game", elem_id="rollout-play-one")
                play_note = gr.HTML("", elem_id="rollout-played")

        outputs = [match, human_board, keyboard, human_status, policy_board, policy_status, exam_note, box]
        restart.click(new_match, match, outputs, api_visibility="private")
        gr.on([box.submit, send.click], guess, [box, match], outputs, api_visibility="private")
        play.click(play_one, None, play_note, concurrency_limit=1, api_visibility="private")
        timer = gr.Timer(refresh_s)
        timer.tick(tick, None, [status, seen], show_progress="hidden", api_visibility="private")
        timer.tick(
            refresh_policy,
            match,
            [policy_board, policy_status, exam_note],
            show_progress="hidden",
            api_visibility="private",
        )
        drawn = [heatmap, timeline, feed, density]
        seen.change(draw, None, drawn, show_progress="hidden", api_visibility="private")
        demo.load(draw, None, drawn, show_progress="hidden", api_visibility="private")
    return demo


def mount_ui(app: FastAPI, service: RolloutService, refresh_s: float = 2.0, trust_forwarded: bool = False) -> FastAPI:
    """Mount the UI at ``/`` on the rollout API app (its routes, such as ``/status``, stay the API's)."""
    return _mount(app, build_ui(service, refresh_s, trust_forwarded=trust_forwarded), CSS)


def _empty_view(note: str | None, opponent: str) -> VersusView:
    return VersusView(
        render.board_html([]),
        render.keyboard_html([]),
        note or "Press **New match** to start.",
        games.board_html(None),
        "",
        opponent,
    )


__all__: Sequence[str] = ["CSS", "build_ui", "mount_ui", "status_markdown"]
