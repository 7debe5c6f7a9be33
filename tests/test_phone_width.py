"""The pages on a phone (390 px wide) in Chromium: the heatmap's column labels stand apart, and the fleet tables (the
trainer's page, the landing page's trainer card) scroll sideways inside their box instead of running off the screen.
The heatmap is drawn by plotly.js from the figure the pages hand to `gr.Plot`; the trainer's page is the real app's,
over heartbeats in a real bucket; the landing page the launcher's, over apps answering their status."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from dashboard import sparsity
from launcher.landing import build_app as landing_app
from dashboard.figures import sparsity_heatmap
from trainer_space import TrainerConfig, build_session
from trainer_space.server import build_app
from wire.fleet import Heartbeat, ServerState
from fleet.bucket import FleetBucket
from wire.trainer import FleetServer

from ._dashboard_states import changed_copy, header_of, qwen3_state
from ._env_server import serving
from .test_launcher_landing import ROLLOUT, answering, ready
from .test_product_browser import browser  # noqa: F401 - the module's chromium, a fixture

PHONE = {"width": 390, "height": 1600}
WAIT_MS = 60_000


@pytest.fixture()
def phone(browser: Browser) -> Iterator[Page]:
    page = browser.new_page(viewport=PHONE)
    page.set_default_timeout(WAIT_MS)
    yield page
    page.close()


def test_the_heatmap_column_labels_do_not_overlap(tmp_path: Path, phone: Page) -> None:
    old = qwen3_state()
    figure = sparsity_heatmap(sparsity(header_of(old, changed_copy(old, dict.fromkeys(old, 3)))))
    page = tmp_path / "heatmap.html"
    page.write_text(figure.to_html(include_plotlyjs=True, config={"responsive": True}))  # plotly.js inlined: offline
    phone.goto(page.as_uri())
    phone.wait_for_selector(".xtick text")
    boxes = phone.eval_on_selector_all(".xtick text", "els => els.map(e => { const r = e.getBoundingClientRect(); "
                                                      "return [e.textContent, r.left, r.right, r.bottom]; })")
    assert [b[0] for b in boxes] == list(figure.data[0].x)  # every column labelled
    overlaps = [(a[0], b[0]) for a, b in zip(boxes, boxes[1:]) if b[1] < a[2] - 0.5]
    assert overlaps == []
    assert max(b[3] for b in boxes) <= phone.evaluate("document.documentElement.scrollHeight")  # none cut off below
    assert max(b[2] for b in boxes) <= PHONE["width"]


def test_the_trainer_fleet_table_scrolls_inside_its_box(tmp_path: Path, phone: Page) -> None:
    bucket = str(tmp_path / "bucket")
    for server in ("rollout", "rollout-1"):
        FleetBucket(bucket).write_heartbeat(Heartbeat(
            server_id=server, boot="b", beat=1, run_id=None, state=ServerState.PRODUCING, version=12,
            games_per_min=3.5, groups_written=40, idle_share=0.1, updated_at=time.time(),
            last_error="12:01:02 RolloutError: the env at http://127.0.0.1:7861 did not answer in 30 s"))
    session = build_session(TrainerConfig(bucket, None, str(tmp_path)))
    try:
        with serving(build_app(session)) as url:
            phone.goto(url)
            phone.wait_for_selector("#trainer-fleet table td")
            box = phone.evaluate("""() => {
                const table = document.querySelector('#trainer-fleet table'), box = table.parentElement;
                const r = box.getBoundingClientRect();
                return {left: r.left, right: r.right, scroll: box.scrollWidth, shown: box.clientWidth,
                        overflow: getComputedStyle(box).overflowX, page: document.documentElement.scrollWidth,
                        rows: [...table.rows].map(row => row.getBoundingClientRect().height)}; }""")
    finally:
        session.close()
    assert box["page"] <= PHONE["width"]  # the page itself never scrolls sideways
    assert 0 <= box["left"] and box["right"] <= PHONE["width"]  # the table's box fits the screen
    assert box["overflow"] == "auto" and box["scroll"] > box["shown"]  # and the table scrolls inside it
    assert max(box["rows"]) < 80  # the last error wraps in a wide column: rows a few lines high, not towers


def test_the_landing_page_fits_and_its_fleet_table_scrolls(tmp_path: Path, phone: Page) -> None:
    beat = {"games_per_min": 12.5, "last_seen_s": 2.0, "idle_share": 0.0, "groups_written": 1, "run_id": "r",
            "last_error": None}
    fleet = [FleetServer(id=name, version=12, state="producing", **beat) for name in ("rollout", "rollout-2")]
    trainer = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    with serving(answering(trainer.model_copy(update={"fleet": fleet}).model_dump())) as url, \
            serving(answering(ROLLOUT.model_dump())) as rollout, serving(answering({"status": "ok"})) as env:
        children = [ready("env", env), ready("rollout", rollout), ready("trainer", url)]
        with serving(landing_app(children, str(tmp_path / "bucket"))) as landing:
            phone.goto(landing)
            phone.wait_for_selector("#fleet td")
            shown = phone.evaluate("""() => ({page: document.documentElement.scrollWidth,
                cards: [...document.querySelectorAll('.card')].map(c => c.getBoundingClientRect().right),
                box: document.querySelector('#fleet').parentElement.getBoundingClientRect().right,
                overflow: getComputedStyle(document.querySelector('#fleet').parentElement).overflowX})""")
    assert shown["page"] <= PHONE["width"]  # a wide card spans the row, not a second column off the screen
    assert max(shown["cards"]) <= PHONE["width"] and shown["box"] <= PHONE["width"] and shown["overflow"] == "auto"
