"""The product as a user runs it, booted once: ``python app.py`` (a tiny model here, two rollout servers), every page
in a browser, a rollout server killed, Ctrl-C, a second start that resumes, and a launcher killed outright.

Playwright drives Debian's chromium through the landing page and the three UIs: the trainer's version number advances
and its delta heatmap and exam curve are drawn, the rollout follows (version, heatmap, a policy game), a person plays a
Wordle game to the end in the env UI, and every page names the same published version (paused: exactly the same).
At 1280 and 390 px, what a visitor reads is what happened: the env page keeps exam, training, showcase and match games
apart, a match names the version whose replies played it and draws every move, and every page fits the width (with
``PAGES_SCREENSHOTS=DIR`` each page is saved there, for a person to look at). Then the launcher: a rollout server SIGKILLed is said and restarted while the trainer publishes on; SIGINT (Ctrl-C;
SIGTERM takes the same path: tests/test_dashboard_serving.py) with every UI's page open stops each app by itself,
leaving logs without a traceback and no process behind; the second start on the same bucket continues the history,
the exams signed before it still verify, and its launcher SIGKILLed takes its apps with it (the kernel's parent-death
signal). Nothing is fetched from outside the machine.

Bounded: the launcher gets 400 s to start; every browser wait is at most `WAIT_MS`. Each `check_*` below is one facet
(tests/README.md maps the tests it replaces).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

import settings
from dashboard.examples import SCHEDULE, SHOWN
from launcher.tokens import KeptTokens
from fleet.exams import ExamShelf
from wire.fleet import fleet_key

from ._launcher import Launch, alive, start_launcher
from ._trainer_stack import tiny_model, wait_until
from .test_env_ui import CHROMIUM, CHROMIUM_ARGS, GUESSES, type_guess

WAIT_MS = 120_000  # a 2-core machine trains, serves and draws beside the browser
WIDTHS = (1280, 390)
PAGES = ("landing", "env", "rollout", "trainer")
WORDS = ["slate", "crony", "bumph", "wight", "fjord", "vaunt"]
OWNER = "owner-of-the-browser-tests"
APPS = ["env", "rollout", "rollout-2", "trainer"]
#: What a clean stop leaves in no app's log: a traceback, a C++ abort, uvicorn cancelling requests, a line per
#: HTTP request.
NOT_IN_A_CLEAN_LOG = ("Traceback", "terminate called", "signal 6", "Aborted", "timeout graceful shutdown exceeded",
                      "CancelledError", "httpx: HTTP Request")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test.sh does it with apt-get)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Tabs:
    """Opens URLs in new pages of one browser; `close()` closes those open (a page left open keeps asking its app every
    two seconds: twenty of them load a 2-core machine as much as the product does). No page may fetch anything off
    this machine (`offsite`)."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.pages: list[Page] = []
        self.offsite: list[str] = []

    def __call__(self, url: str, width: int = 1400) -> Page:
        page = self.browser.new_page(viewport={"width": width, "height": 1200})
        page.set_default_timeout(WAIT_MS)
        page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1:", "data:", "blob:"))
                else self.offsite.append(r.url))
        page.goto(url)
        self.pages.append(page)
        return page

    def close(self) -> None:
        while self.pages:
            self.pages.pop().close()


@pytest.fixture()
def open_page(browser: Browser) -> Iterator[Tabs]:
    """Open a URL in a new page; after the test, no page may have fetched anything off this machine."""
    expect.set_options(timeout=WAIT_MS)
    tabs = Tabs(browser)
    yield tabs
    tabs.close()
    assert tabs.offsite == [], f"pages fetched from outside the machine: {tabs.offsite[:5]}"


def test_the_product_in_a_browser_through_a_killed_server_ctrl_c_and_a_restart(tmp_path: Path, open_page: Tabs) -> None:
    model = tiny_model(str(tmp_path / "model"))
    bucket, logs = tmp_path / "bucket", tmp_path / "logs"
    first = start_launcher(model, bucket, logs, tmp_path / "first.out", "--rollouts", "2", "--owner-token", OWNER)
    try:
        first.wait_ready(400)
        check_every_app_answers_and_holds_its_tokens(first)
        for check in (check_landing_page_links_the_live_apps, check_trainer_ui_version_advances_and_heatmap_is_drawn,
                      check_rollout_ui_follows_and_shows_a_policy_game, check_a_person_plays_a_game_to_the_end,
                      check_trainer_page_draws_the_exam_curve_and_its_reference_lines,
                      check_the_landing_card_shows_both_example_figures_beside_the_valid_guess_rate,
                      check_every_page_shows_the_same_published_version):
            check(first, open_page)
            open_page.close()
        first_exams = check_the_exams_of_v0_and_of_the_block_of_5(first)
        # What a visitor reads is what happened, on a desk and on a phone: read with the run paused (a person may look
        # at a paused run; the pages are the same, and the machine is not also training).
        with paused(first):
            for width in WIDTHS:
                for check_at in (check_the_env_page_keeps_each_kind_of_game_apart,
                                 check_a_match_names_the_version_that_played_it_and_draws_every_move,
                                 check_every_page_fits_the_width):
                    check_at(first, open_page, width)
                    open_page.close()
        check_a_killed_rollout_server_is_said_and_restarted(first)
        pids = first.app_pids()
        assert len(pids) >= len(APPS)
        with pages_open([first.url(app) for app in ("env", "rollout", "trainer")]):
            assert first.status("trainer")["state"] == "running"  # mid-work: training, playing, serving
            assert first.stop(signal.SIGINT) == 0
    finally:
        if first.proc.poll() is None:
            first.kill()
    check_ctrl_c_stopped_every_app_cleanly(first, logs, pids)
    first_steps = history_steps(bucket)
    assert first_steps, "the first run's history was not kept in the bucket"

    second = start_launcher(model, bucket, logs, tmp_path / "second.out", "--rollouts", "2", "--owner-token", OWNER)
    try:
        second.wait_ready(400)
        check_a_second_start_resumes_the_run(second, first_steps, first_exams, KeptTokens(str(tmp_path / "keys"),
                                                                                       str(bucket)), bucket)
        pids = second.app_pids()  # killed with no chance to clean up: the kernel's parent-death signal stops the apps
        second.proc.kill()
        second.proc.wait()
        deadline = time.monotonic() + 60
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if second.proc.poll() is None:
            second.kill()
    assert alive(pids) == set(), f"apps outlived a SIGKILLed launcher: {alive(pids)}"


# --- the apps, their pages --------------------------------------------------------------------------------------------


def check_every_app_answers_and_holds_its_tokens(launch: Launch) -> None:
    def states() -> list[tuple[str, str]]:
        cards = httpx.get(f"{launch.url('landing')}/api/status", timeout=10).json()["apps"]
        return [(c["name"], c["state"]) for c in cards]

    # (a card reads "not answering" while its app is too busy to answer within a second: loading a model on a loaded
    # machine, say)
    wait_until(lambda: sorted(states()) == [(app, "ready") for app in APPS], 60, "every card ready")
    assert "delta-sync" in httpx.get(launch.url("landing"), timeout=10).text
    for app in ("env", "rollout", "trainer"):
        assert httpx.get(f"{launch.url(app)}/health", timeout=10).status_code == 200
    # The apps hold their tokens: the trainer's rollouts pass, an anonymous caller's are refused.
    assert httpx.post(f"{launch.url('rollout')}/generate", json={"prompts": ["hi"]}, timeout=10).status_code == 401
    assert "rollout token" in launch.output()


def shown_version(page: Page, locator: str, pattern: str) -> int:
    """The version number a UI shows now (-1 while it shows none)."""
    match = re.search(pattern, page.locator(locator).first.inner_text())
    return int(match.group(1)) if match else -1


def check_landing_page_links_the_live_apps(launch: Launch, open_page: Callable[[str], Page]) -> None:
    page = open_page(launch.url("landing"))
    for role in ("env", "rollout", "trainer"):
        card = page.locator(f"#card-{role}")
        expect(card).to_have_attribute("data-state", "ready")
        expect(card.locator("a.open")).to_have_attribute("href", f"{launch.url(role)}/")
    expect(page.locator("#card-trainer")).to_contain_text("published version")
    page.locator("#card-env h2 a").click()
    expect(page.locator("#wordle-status")).to_contain_text("6 guesses left")


def check_trainer_ui_version_advances_and_heatmap_is_drawn(launch: Launch, open_page: Callable[[str], Page]) -> None:
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


def check_trainer_page_draws_the_exam_curve_and_its_reference_lines(launch: Launch,
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
    expect(rollout.locator("#versus-exam")).to_contain_text(re.compile(r"the latest exam up to its version is of v\d+"))


def first_word_after_the_tag(reply: str) -> str:
    """The first word the model wrote after the last <guess> (what the strict rule scores), read by hand."""
    after = re.split(r"<guess>", reply, flags=re.IGNORECASE)[-1].split("<")[0].split()
    return after[0].strip("\"'`*_.,;:!?()[]{}<>") if after else ""


def check_the_landing_card_shows_both_example_figures_beside_the_valid_guess_rate(
        launch: Launch, open_page: Callable[[str], Page]) -> None:
    """A training valid guess may be a copy of the env's example: right after the rate, the landing card gives the
    share of messages that showed one (measured, beside what the schedule gave those games) and the schedule now,
    each under the one name every page gives it (`dashboard.examples`)."""
    page = open_page(launch.url("landing"))
    card = page.locator("#card-trainer")
    expect(card).to_contain_text(SHOWN)
    labels = card.locator("dt").all_inner_texts()
    rate = next(i for i, t in enumerate(labels) if t.startswith("valid guesses (strict)"))
    assert labels[rate + 1:rate + 3] == [SHOWN, SCHEDULE], labels
    shown, schedule = (card.locator("dd").nth(rate + i).inner_text() for i in (1, 2))
    assert re.fullmatch(r"—|\d+% of the messages of the games trained on( \(first \d+ steps?\))?"
                        r"(; the schedule gave those games \d+%)?", shown), shown
    assert re.fullmatch(r"\d+% of messages in games started by v\d+ \(.+\)", schedule), schedule


def check_rollout_ui_follows_and_shows_a_policy_game(launch: Launch, open_page: Callable[[str], Page]) -> None:
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


def check_a_person_plays_a_game_to_the_end(launch: Launch, open_page: Callable[[str], Page]) -> None:
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


def check_every_page_shows_the_same_published_version(launch: Launch, open_page: Callable[[str], Page]) -> None:
    """Read at one moment, the landing, trainer and rollout pages name the same published version (within one: each
    refreshes every two seconds while versions come every few); paused, exactly the same one, with its step."""
    pages = [open_page(launch.url(app)) for app in ("landing", "trainer", "rollout")]
    wait_until(lambda: min(versions_shown(*pages).values()) >= 2, WAIT_MS / 1000, "every page to show version 2")
    # Read at one moment (the three pages one right after the other), within 30 s: each page refreshes on its own
    # timer in its own tab, and a busy trainer answers its page's timer late now and then.
    wait_until(lambda: max((running := versions_shown(*pages)).values()) - min(running.values()) <= 1, 30,
               "the three pages to show one version (within one)")
    with paused(launch):
        def last_step() -> int:
            return httpx.get(f"{launch.url('trainer')}/history", timeout=10).json()["steps"][-1]["step"]

        # The pause holds at the end of the step in flight (or that step waits for games the paused servers no longer
        # play): then its newest version is committed and holds every step logged.
        status = wait_until(lambda: ((s := launch.status("trainer"))["held"] or s["waiting_for_rollouts"])
                            and s["version"] == s["trainer_version"] and s["step"] == last_step() and s, 120,
                            "the paused trainer to hold, its last version committed")
        wait_until(lambda: set(versions_shown(*pages).values()) == {status["version"]}, 30,
                   f"every page to show version {status['version']} while paused")
        # The version and the steps it holds, together, for the whole pause (not "version 8 · step 7").
        assert f"version {status['version']} · step {status['step']}" in pages[1].locator("body").inner_text()
        assert launch.status("trainer")["step"] == status["step"] == last_step()  # no step after the pause


@contextmanager
def paused(launch: Launch) -> Iterator[None]:
    """The run paused by its owner (the trainer's `/control`) for the block, started again after it."""
    control = {"action": "pause", "token": OWNER}
    assert httpx.post(f"{launch.url('trainer')}/control", json=control, timeout=10).json()["state"] == "paused"
    try:
        yield
    finally:
        httpx.post(f"{launch.url('trainer')}/control", json={**control, "action": "start"}, timeout=10)


# --- the launcher: exams, a killed server, Ctrl-C, a second start -------------------------------------------------------


def check_the_exams_of_v0_and_of_the_block_of_5(launch: Launch) -> list[int]:
    """The untrained policy's exam, taken after the server's first batch (it never held the first step back), and the
    next one (of the first version a server held in the block of 5 to 9: every 5 versions, and a server may skip one
    while the trainer publishes fast): the two the second start must keep."""
    exams = wait_until(lambda: (v := [e["version"] for e in launch.status("trainer")["exams"]][:2])[:1] == [0]
                       and len(v) == 2 and v, 240, "the exams of v0 and of the block of v5")
    assert 5 <= exams[1] < 10, exams
    return exams


def check_a_killed_rollout_server_is_said_and_restarted(launch: Launch) -> None:
    """SIGKILL one of the two rollout servers: the launcher says so and restarts it, the trainer keeps publishing, the
    landing page shows the restart."""
    os.kill(launch.app_pid("rollout-2"), signal.SIGKILL)
    killed_at = launch.status("trainer")["version"]
    wait_until(lambda: "rollout-2 killed by signal 9 (SIGKILL), not by the launcher" in launch.output(), 30,
               "the launcher to say what happened to rollout-2")
    wait_until(lambda: launch.status("trainer")["version"] >= killed_at + 2, 300,
               "two more versions with one rollout server gone")
    wait_until(lambda: "rollout-2 is back (restart 1)" in launch.output(), 300, "rollout-2 to restart")
    cards = {c["name"]: c for c in httpx.get(f"{launch.url('landing')}/api/status", timeout=10).json()["apps"]}
    assert cards["rollout-2"]["state"] == "ready" and ["restarts", "1 (last exit: killed by signal 9 (SIGKILL), "
                                                                   "not by the launcher)"] in cards["rollout-2"]["fields"]


@contextmanager
def pages_open(urls: list[str]) -> Iterator[None]:
    """Hold each UI's session heartbeat open, as a browser tab on the page does, until the block ends."""
    def hold(url: str) -> None:
        try:
            with httpx.stream("GET", f"{url}/gradio_api/heartbeat/test-{url.rsplit(':', 1)[1]}", timeout=None) as r:
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:  # the server went away: what a closing tab sees
            pass

    holders = [threading.Thread(target=hold, args=(u,), daemon=True) for u in urls]
    for t in holders:
        t.start()
    time.sleep(1.0)
    yield
    for t in holders:
        t.join(30)


def check_ctrl_c_stopped_every_app_cleanly(launch: Launch, logs: Path, pids: set[int]) -> None:
    """Every app stopped by itself (exit status 0: before `dashboard.deadline` would have ended it, and long before the
    launcher's kill), its log holds nothing of a messy stop, no process is left, and one server examined each version."""
    output = launch.output()
    assert "stopping trainer, rollout-2, rollout, env" in output and "all stopped" in output
    for app in APPS:
        stopped = re.search(rf"\[app\] {app} stopped in ([\d.]+) s \(exit status 0\)", output)
        assert stopped, f"{app} did not stop cleanly:\n{output}"
        log = (logs / f"{app}.log").read_text(errors="replace")
        assert [bad for bad in NOT_IN_A_CLEAN_LOG if bad in log] == [], f"{app}.log:\n{log[-3000:]}"
    assert f"stopping all {len(APPS)} apps" in output
    assert alive(pids) == set(), f"processes left after Ctrl-C: {alive(pids)}"
    examined = [int(v) for name in ("rollout", "rollout-2")
                for v in re.findall(r"exam of v(\d+):", (logs / f"{name}.log").read_text(errors="replace"))]
    assert examined and len(examined) == len(set(examined)), examined  # never the same version's exam twice
    assert settings.STOP_DEADLINE_S < settings.STOP_WITHIN_S  # status 0 comes before the deadline, within the promise


def history_steps(bucket: Path) -> list[tuple[int, int]]:
    """(step, version) of every step record in the bucket's history file (what the next trainer reads)."""
    from wire.history import HISTORY_PATH, decode_history

    return [(r.step, r.version) for r in decode_history((bucket / HISTORY_PATH).read_bytes()).history.steps]


def check_a_second_start_resumes_the_run(launch: Launch, first_steps: list[tuple[int, int]], first_exams: list[int],
                                         kept: KeptTokens, bucket: Path) -> None:
    status = wait_until(lambda: (s := launch.status("trainer"))["resumed_from"] is not None and s, 120,
                        "the trainer to resume")
    assert status["resumed_from"] >= 2
    resumed = status["resumed_from"]
    wait_until(lambda: launch.status("trainer")["version"] > resumed, 120, "a version after the resumed one")
    # The restarted trainer shows the earlier versions' points and goes on counting steps from them.
    history = httpx.get(f"{launch.url('trainer')}/history", timeout=10).json()
    steps = [(r["step"], r["version"]) for r in history["steps"]]
    earlier = [(s, v) for s, v in first_steps if v <= resumed]
    assert steps[:len(earlier)] == earlier and len(steps) > len(earlier)
    assert [s for s, _ in steps] == list(range(1, len(steps) + 1))  # one count across both processes
    assert launch.status("trainer")["step"] >= earlier[-1][0]
    assert [a["version"] for a in history["anchors"]][:1] == [1]  # the first version's full copy, still shown
    # The launcher kept its tokens: the exams signed before the restart still verify, every one is shown, and no
    # page calls a file of the run "forged".
    key = fleet_key(kept.read()["ROLLOUT_TOKEN"])
    in_bucket = [r.model_dump(mode="json") for r in ExamShelf(str(bucket), key).records()]
    assert [r["version"] for r in in_bucket][:2] == first_exams and history["exams"] == in_bucket
    status = launch.status("trainer")
    assert status["exams_refused"] == {} and [e["version"] for e in status["exams"]][:2] == first_exams
    wait_until(lambda: all(s["state"] in ("producing", "full") for s in launch.status("trainer")["fleet"]), 60,
               "the servers producing again")
    shown = str(launch.status("trainer")["fleet"]) + str(launch.status("rollout"))
    assert "forged" not in shown and "signature" not in shown, shown


# --- what a visitor reads, at both widths (issue 67) --------------------------------------------------------------------


def screenshot(page: Page, name: str) -> None:
    """The whole page as a PNG in `PAGES_SCREENSHOTS` (when set), for a person to look at."""
    folder = os.environ.get("PAGES_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def env_games(launch: Launch, **params: Any) -> list[dict[str, Any]]:
    return httpx.get(f"{launch.url('env')}/games", params={"limit": 200, **params}, timeout=10).json()


def fits(page: Page, width: int, selector: str) -> list[str]:
    """The elements of `selector` that leave the screen sideways (their text), and the page itself if it does; waits
    for the page to draw them first (a page still loading has none to check)."""
    expect(page.locator(selector).first).to_be_visible()
    out = page.eval_on_selector_all(
        selector, f"els => els.filter(e => {{ const r = e.getBoundingClientRect(); "
                  f"return r.width > 0 && (r.left < -0.5 || r.right > {width} + 0.5); }}).map(e => e.textContent)")
    if page.evaluate("document.documentElement.scrollWidth") > width:
        out.append("the page scrolls sideways")
    return out


def check_the_env_page_keeps_each_kind_of_game_apart(launch: Launch, open_page: Callable[..., Page], width: int) -> None:
    """Exam, training, showcase and match games kept apart: each feed entry is of the kind the env recorded, the feed
    shows one kind on request, and the players table and the win-rate chart count each kind alone; the keyboard fits."""
    wait_until(lambda: env_games(launch, kind="exam") and env_games(launch, kind="training"), WAIT_MS / 1000,
               "the env to record an exam game and a training game")
    page = open_page(launch.url("env"), width)
    note = page.locator("#wordle-unfinished-note")
    expect(note).to_contain_text("exam game")
    assert "every request shows" not in note.inner_text()  # the examples fade: no page says they are always there
    kinds = {g["episode_id"]: g["kind"] for g in env_games(launch)}
    feed = page.locator("#wordle-feed [data-testid=game]")
    expect(feed).not_to_have_count(0)
    for game in feed.all():  # each entry says the kind the env recorded for that game
        episode = game.get_attribute("data-episode")
        if episode in kinds:
            assert game.locator("[data-testid=kind]").get_attribute("data-kind") == kinds[episode], episode
    for kind in ("exam", "training"):  # one kind at a time: the few exam games are not pushed out by training games
        page.locator("#wordle-feed-kind").get_by_label(kind, exact=True).check()
        expect(page.locator(f"#wordle-feed [data-testid=kind]:not([data-kind={kind}])")).to_have_count(0)
        expect(page.locator(f"#wordle-feed [data-kind={kind}]")).not_to_have_count(0)
    # The table: a row per player and kind, each with the env's own count for that kind alone.
    # The table shows the newest versions first (a long run's oldest rows fall off its end): an exam done before the
    # latest one (its count final) is there with the env's count.
    stats = httpx.get(f"{launch.url('env')}/stats", timeout=10).json()
    exams = sorted((s for s in stats if s["kind"] == "exam"), key=lambda s: -int(s["player"].rsplit("v", 1)[1]))
    done = exams[1] if len(exams) > 1 else exams[0]
    table = page.locator("#wordle-stats")
    expect(table).to_contain_text(f"{done['player']}\nexam\n{done['games']}\n")
    expect(table).to_contain_text(re.compile(r"policy v\d+\s+training\s+\d+"))
    expect(page.locator("#wordle-win-plot")).to_contain_text("kind of game")  # one line per kind, with its legend
    assert fits(page, width, "[data-testid=keyboard] .wordle-key") == []  # P and BACK on the screen


def match_label(status: str) -> str:
    """ "v12" or "v12–v13" from the policy's status once its game is over ("Policy v12: unfinished ...")."""
    found = re.search(r"Policy (v\d+(?:–v\d+)?)[: ]", status)
    assert found, status
    return found.group(1)


def check_a_match_names_the_version_that_played_it_and_draws_every_move(launch: Launch, open_page: Callable[..., Page],
                                                                        width: int) -> None:
    """The match names the version whose replies played the policy's side, not the one served when the page last
    ticked, says before the game that the policy is shown the env's examples, and draws its invalid moves as they come
    with what to expect."""
    page = open_page(launch.url("rollout"), width)
    opponent, status = page.locator("#versus-exam"), page.locator("#versus-policy-status")
    expect(opponent).to_contain_text("served now")
    page.locator("#versus-new-match").click()
    expect(page.locator("#versus-status")).to_contain_text("6 guesses left")
    # Before the game: who plays (the version served as the match began, until its replies say which played) and
    # that, unlike in its exam, its messages show the env's example.
    expect(opponent).to_contain_text(re.compile(r"as this match began|Your opponent: policy v\d+"))
    expect(opponent).to_contain_text("shown the env's example word (never the secret) in every message")
    # Its moves show as they come, invalid ones too (a tiny random model makes mostly those), with what to expect.
    marks = page.locator("#versus-policy [data-testid=policy-moves] [data-move]")
    expect(marks.first).to_be_attached()
    said = status.inner_text()
    screenshot(page, f"rollout-match-playing-{width}")
    if "The policy is playing" in said:
        moves = int(re.search(r"The policy is playing: (\d+) moves?", said).group(1))
        assert marks.count() >= moves and "a move on this machine" in said and "more move" in said, said
    box = page.locator("#versus-input textarea, #versus-input input").first
    for n, word in enumerate(WORDS, start=1):
        box.fill(word)
        box.press("Enter")
        expect(page.locator("[data-testid=board] [data-mark]")).to_have_count(5 * n)  # taken before the next
        if "The word was" in page.locator("#versus-status").inner_text():
            break
    expect(page.locator("#versus-status")).to_contain_text("The word was")
    expect(status).to_contain_text(re.compile(r"Policy v\d+(–v\d+)?: "))  # its game over too
    label = match_label(status.inner_text())
    served = httpx.get(f"{launch.url('rollout')}/status", timeout=10).json()["version"]
    # The opponent is the version whose replies played, however far the server has moved on since.
    expect(opponent).to_contain_text(f"Your opponent: policy {label}")
    last = int(label.rsplit("v", 1)[1])
    assert served >= last and (served == last or f"policy v{served}" not in opponent.inner_text())
    assert page.locator("#versus-policy [data-testid=moves] li").count() >= 1  # and now what it wrote, move by move
    screenshot(page, f"rollout-match-over-{width}")
    assert fits(page, width, "[data-testid=keyboard] .wordle-key") == []
    # Both games are the env's record of a match: its counts (the full records of the latest 200 games only: the
    # policy's ended long before the person's, while training games went on).
    stats = httpx.get(f"{launch.url('env')}/stats", timeout=10).json()
    players = {s["player"] for s in stats if s["kind"] == "match"}
    assert "human" in players and any(p.startswith("policy v") for p in players), stats
    assert "human" in {g["player"] for g in env_games(launch, kind="match")}


def plot_titles_outside(page: Page) -> list[str]:
    """The chart titles (and panel titles) of the page that run past their chart's edges."""
    return page.eval_on_selector_all(".js-plotly-plot", """plots => plots.flatMap(p => {
        const box = p.querySelector('svg.main-svg').getBoundingClientRect();
        return [...p.querySelectorAll('.gtitle, .annotation-text')].filter(t => {
            const r = t.getBoundingClientRect();
            return r.width > 0 && (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5);
        }).map(t => t.textContent); })""")


def check_every_page_fits_the_width(launch: Launch, open_page: Callable[..., Page], width: int) -> None:
    """The on-screen keyboards, the charts' titles, the trainer's fleet table: nothing leaves the screen sideways."""
    for app in PAGES:
        page = open_page(launch.url(app), width)
        if app == "landing":
            expect(page.locator("#card-env")).to_contain_text("policy's training games")  # the env's counts, by kind
        elif app == "env":
            expect(page.locator("#wordle-feed [data-testid=game]")).not_to_have_count(0)
            expect(page.locator("#wordle-stats")).to_contain_text(re.compile(r"policy v\d+"))  # newest first
        elif app == "rollout":
            expect(page.locator("#rollout-status")).to_contain_text("Serving v")
            expect(page.locator("#rollout-heatmap .gtitle")).to_contain_text("Delta v")
        elif app == "trainer":
            expect(page.locator("#trainer-learning .gtitle")).to_contain_text("Training games")
            expect(page.locator("#trainer-exam .gtitle")).to_contain_text("The exam")
            expect(page.locator("#trainer-fleet table tr")).not_to_have_count(0)
            fleet = page.locator("#trainer-fleet .fleet-box")  # the table's own box
            if width >= 1280:  # every column in sight, none behind a sideways scroll
                assert fleet.evaluate("box => box.scrollWidth <= box.clientWidth + 1"), "a fleet column is hidden"
        if app in ("env", "rollout"):
            assert fits(page, width, "[data-testid=keyboard] .wordle-key") == []
        if app in ("rollout", "trainer"):
            assert plot_titles_outside(page) == []
        assert fits(page, width, "h1, h2, p") == [], app
        screenshot(page, f"{app}-{width}")
