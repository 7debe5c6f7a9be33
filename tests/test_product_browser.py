"""The whole product in a browser, started as a user starts it: ``python app.py`` (a tiny model here).

Playwright drives Debian's chromium through the landing page and the three UIs: the trainer's
version number advances and its delta heatmap is drawn, the rollout follows (version, heatmap, a
policy game), and a person plays a Wordle game to the end in the env UI. Nothing is fetched from
outside the machine. Then SIGTERM stops everything, leaving no process behind.

Bounded: the launcher gets 300 s to start; every browser wait is at most `WAIT_MS`.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from ._launcher import Launch, alive, start_launcher
from ._trainer_stack import tiny_model, wait_until
from .test_env_ui import CHROMIUM, CHROMIUM_ARGS, GUESSES, type_guess

WAIT_MS = 90_000  # a 2-core machine trains, serves and draws beside the browser
OWNER = "owner-of-the-browser-tests"


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    root = tmp_path_factory.mktemp("product")
    model = tiny_model(str(root / "model"))
    started = start_launcher(model, root / "bucket", root / "logs", root / "launcher.out", "--owner-token", OWNER)
    try:
        started.wait_ready(300)
        yield started
        pids = started.app_pids()
        assert started.stop(signal.SIGTERM) == 0, started.output()
        assert alive(pids) == set(), f"processes left after SIGTERM: {alive(pids)}"
    finally:
        if started.proc.poll() is None:
            started.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test.sh does it with apt-get)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture()
def open_page(browser: Browser) -> Iterator[Callable[[str], Page]]:
    """Open a URL in a new page; after the test, no page may have fetched anything off this machine."""
    pages: list[Page] = []
    offsite: list[str] = []

    def opener(url: str) -> Page:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.set_default_timeout(WAIT_MS)
        page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1:", "data:", "blob:"))
                else offsite.append(r.url))
        page.goto(url)
        pages.append(page)
        return page

    expect.set_options(timeout=WAIT_MS)
    yield opener
    for page in pages:
        page.close()
    assert offsite == [], f"pages fetched from outside the machine: {offsite[:5]}"


def shown_version(page: Page, locator: str, pattern: str) -> int:
    """The version number a UI shows now (-1 while it shows none)."""
    match = re.search(pattern, page.locator(locator).first.inner_text())
    return int(match.group(1)) if match else -1


def test_landing_page_links_three_live_apps(launch: Launch, open_page: Callable[[str], Page]) -> None:
    page = open_page(launch.url("landing"))
    for role in ("env", "rollout", "trainer"):
        card = page.locator(f"#card-{role}")
        expect(card).to_have_attribute("data-state", "ready")
        expect(card.locator("a.open")).to_have_attribute("href", f"{launch.url(role)}/")
    expect(page.locator("#card-trainer")).to_contain_text("published version")
    page.locator("#card-env h2 a").click()
    expect(page.locator("#wordle-status")).to_contain_text("6 guesses left")


def test_trainer_ui_version_advances_and_heatmap_is_drawn(launch: Launch, open_page: Callable[[str], Page]) -> None:
    page = open_page(launch.url("trainer"))
    body = "body"
    expect(page.locator(body)).to_contain_text(re.compile(r"version \d+ · step"))
    first = shown_version(page, body, r"version (\d+) · step")
    wait_until(lambda: shown_version(page, body, r"version (\d+) · step") > first, WAIT_MS / 1000,
               "the trainer UI's version to advance")
    expect(page.locator(body)).to_contain_text(re.compile(r"Delta v\d+→v\d+ published"))
    expect(page.locator(".js-plotly-plot .heatmaplayer")).not_to_have_count(0)
    expect(page.locator("[data-testid=policy-feed] [data-testid=policy-game]")).not_to_have_count(0)
    expect(page.locator("[data-testid=policy-feed]")).to_contain_text(re.compile(r"policy v\d+"))
    moves = page.locator("[data-testid=policy-feed] [data-testid=moves] li")
    expect(moves).not_to_have_count(0)
    # One read of every move (closed <details> included; the feed is redrawn as games come in).
    read = moves.evaluate_all("items => items.map(li => [li.textContent, li.title, "
                              "li.querySelector('.wordle-why')?.textContent || ''])")
    for text, title, why in read:  # what the page says each move scored, against what the model wrote
        verdict = re.match(r"\d+\. (\S+):", text).group(1)
        if verdict == "invalid":
            assert why, f"an invalid move without its reason: {text!r}"
        else:
            assert verdict == first_word_after_the_tag(title).upper(), (verdict, title)


def test_trainer_page_draws_the_exam_curve_and_its_reference_lines(launch: Launch,
                                                                   open_page: Callable[[str], Page]) -> None:
    """The exam of version 0 (the untrained policy) comes right after the server's first training batch: the curve,
    the untrained policy's line and the copy-only player's line, each named in the figure's legend."""
    page = open_page(launch.url("trainer"))
    exam = page.locator("#trainer-exam")
    for name in ("exam: own words", "exam: any valid word", "untrained policy (v0)", "copy-only player (examples on)"):
        expect(exam.locator(".legendtext", has_text=name)).to_have_count(1)
    expect(exam.locator(".scatterlayer .trace")).not_to_have_count(0)
    expect(exam).to_contain_text("valid-guess rate (strict)")
    expect(page.locator("#trainer-exam-note")).to_contain_text("held-out secret words")
    landing = open_page(launch.url("landing"))
    expect(landing.locator("#card-trainer")).to_contain_text(re.compile(r"last exam .*v\d+: own words on \d+% of moves"))
    rollout = open_page(launch.url("rollout"))
    expect(rollout.locator("#versus-exam")).to_contain_text(re.compile(r"its (own exam|latest exam is of v\d+)"))


def first_word_after_the_tag(reply: str) -> str:
    """The first word the model wrote after the last <guess> (what the strict rule scores), read by hand."""
    after = re.split(r"<guess>", reply, flags=re.IGNORECASE)[-1].split("<")[0].split()
    return after[0].strip("\"'`*_.,;:!?()[]{}<>") if after else ""


def test_the_landing_card_shows_the_example_share_beside_the_valid_guess_rate(
        launch: Launch, open_page: Callable[[str], Page]) -> None:
    """A training valid guess may be a copy of the env's example: the landing card says how many messages showed
    one, right after the rate, and points to the exam."""
    page = open_page(launch.url("landing"))
    card = page.locator("#card-trainer")
    expect(card).to_contain_text("messages that showed the env's example")
    labels = card.locator("dt").all_inner_texts()
    rate = next(i for i, t in enumerate(labels) if t.startswith("valid guesses (strict)"))
    assert labels[rate + 1] == "messages that showed the env's example (a copy counts as valid)", labels
    share = card.locator("dd").nth(rate + 1).inner_text()
    assert re.fullmatch(r"\d+% (\(last \d+ steps?\)|by the run's schedule) · what the policy plays alone: the exam, "
                        r"below", share), share


def test_rollout_ui_follows_and_shows_a_policy_game(launch: Launch, open_page: Callable[[str], Page]) -> None:
    page = open_page(launch.url("rollout"))
    status = "#rollout-status"
    expect(page.locator(status)).to_contain_text(re.compile(r"Serving v\d+"))
    first = shown_version(page, status, r"Serving v(\d+)")
    wait_until(lambda: shown_version(page, status, r"Serving v(\d+)") > first, WAIT_MS / 1000,
               "the rollout UI's version to advance")
    heatmap = page.locator("#rollout-heatmap")
    expect(heatmap).to_contain_text(re.compile(r"Delta v\d+→v\d+ applied here"))
    expect(heatmap.locator(".heatmaplayer image, .hm")).not_to_have_count(0)
    page.locator("#rollout-play-one").click()
    expect(page.locator("[data-testid=policy-feed] [data-testid=policy-game]")).not_to_have_count(0)


def test_a_person_plays_a_game_to_the_end(launch: Launch, open_page: Callable[[str], Page]) -> None:
    page = open_page(launch.url("env"))
    status = page.locator("#wordle-status")
    scored = page.locator("[data-testid=board] [data-mark]")
    expect(status).to_contain_text("6 guesses left")
    for n, word in enumerate(GUESSES[1:], start=1):
        type_guess(page, word)
        expect(scored).to_have_count(5 * n)
        if "The word was" in status.inner_text():
            break
    expect(status).to_contain_text("The word was")
    assert Path(launch.out).exists()


def versions_shown(landing: Page, trainer: Page, rollout: Page) -> dict[str, int]:
    """The published version each page shows now, read one page right after the other."""
    card = landing.locator("#card-trainer dl").inner_text()
    return {"landing": int(m.group(1)) if (m := re.search(r"published version\s+(\d+)", card)) else 0,
            "trainer": shown_version(trainer, "body", r"version (\d+) · step"),
            "rollout": shown_version(rollout, "#rollout-status", r"(?:trainer's latest |with the trainer \()v(\d+)")}


def test_every_page_shows_the_same_published_version(launch: Launch, open_page: Callable[[str], Page]) -> None:
    """Read at one moment, the landing, trainer and rollout pages name the same published version (within one: each
    refreshes every two seconds while versions come every few); paused, exactly the same one, with its step."""
    pages = [open_page(launch.url(app)) for app in ("landing", "trainer", "rollout")]
    wait_until(lambda: min(versions_shown(*pages).values()) >= 2, WAIT_MS / 1000, "every page to show version 2")
    # Read at one moment (the three pages one right after the other), within 30 s: each page refreshes on its own
    # timer in its own tab, and a busy trainer answers its page's timer late now and then.
    wait_until(lambda: max((running := versions_shown(*pages)).values()) - min(running.values()) <= 1, 30,
               "the three pages to show one version (within one)")
    control = {"action": "pause", "token": OWNER}
    assert httpx.post(f"{launch.url('trainer')}/control", json=control, timeout=10).json()["state"] == "paused"
    try:
        def last_step() -> int:
            return httpx.get(f"{launch.url('trainer')}/history", timeout=10).json()["steps"][-1]["step"]

        def committed() -> dict:
            """The status once the newest version is committed and holds every step logged."""
            return wait_until(lambda: (s := launch.status("trainer"))["version"] == s["trainer_version"]
                              and s["step"] == last_step() and s, 120, "the paused trainer's last version to be committed")

        # The pause holds at the end of the step in flight: wait for that step (twice a step's time), then read.
        time.sleep(2 * (committed()["step_s"] or 10))
        status = committed()
        wait_until(lambda: set(versions_shown(*pages).values()) == {status["version"]}, 30,
                   f"every page to show version {status['version']} while paused")
        # The version and the steps it holds, together, for the whole pause (not "version 8 · step 7").
        assert f"version {status['version']} · step {status['step']}" in pages[1].locator("body").inner_text()
        assert status["step"] == last_step()  # no step after the pause
    finally:
        httpx.post(f"{launch.url('trainer')}/control", json={**control, "action": "start"}, timeout=10)
