"""The Gradio UI in a real browser: Playwright drives Debian's chromium against a real server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from ._env_server import running_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
GUESSES = ["xyzzy", "slate", "crony", "bumph", "wight", "fjord", "vaunt"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server("env", env={"ENV_TOKEN": "ui-test-token"}) as base:
        yield base


@pytest.fixture()
def page(url: str) -> Iterator[Page]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (scripts/test.sh does it with apt-get)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        offsite: list[str] = []
        page.on("request", lambda r: offsite.append(r.url) if not r.url.startswith(url) else None)
        page.goto(url)
        expect(page.locator("#wordle-status")).to_contain_text("6 guesses left", timeout=30_000)
        yield page
        browser.close()
        assert offsite == [], "the page must not fetch anything from outside the server"


def type_guess(page: Page, word: str) -> None:
    box = page.locator("#wordle-input textarea, #wordle-input input").first
    box.fill(word)
    box.press("Enter")


def test_a_person_plays_a_game_to_the_end(url: str, page: Page) -> None:
    status = page.locator("#wordle-status")
    scored = page.locator("[data-testid=board] [data-mark]")

    type_guess(page, "cr4ne")
    expect(status).to_contain_text("Not accepted: 'cr4ne' must contain only the letters a-z. 6 guesses left.")
    type_guess(page, GUESSES[0])
    expect(status).to_contain_text("Not accepted: 'xyzzy' is not in the word list.")
    expect(scored).to_have_count(0)

    for n, word in enumerate(GUESSES[1:], start=1):
        type_guess(page, word)
        expect(scored).to_have_count(5 * n)
        if "The word was" in status.inner_text():
            break
    expect(status).to_contain_text("The word was")
    first_row = [scored.nth(i).inner_text().lower() for i in range(5)]
    assert first_row == list("slate")
    assert (
        page.locator(
            "[data-testid=keyboard] .wordle-key.gray, [data-testid=keyboard] .wordle-key.yellow, "
            "[data-testid=keyboard] .wordle-key.green"
        ).count()
        > 0
    )

    type_guess(page, "slate")
    expect(status).to_contain_text("Press New game to play again.")
    page.locator("#wordle-new-game").click()
    expect(status).to_contain_text("6 guesses left")
    expect(scored).to_have_count(0)
    expect(page.locator("[data-testid=keyboard] .wordle-key.gray")).to_have_count(0)
    humans = [s for s in httpx.get(f"{url}/stats").json() if s["player"] == "human"]
    assert humans and humans[0]["games"] >= 1


def test_the_on_screen_keyboard_types_deletes_and_guesses(url: str, page: Page) -> None:
    status = page.locator("#wordle-status")
    expect(status).to_contain_text("6 guesses left")
    keys = page.locator("[data-testid=keyboard]")
    for key in "slatx":
        keys.locator(f"[data-key={key}]").click()
    keys.locator("[data-key=back]").click()
    keys.locator("[data-key=e]").click()
    expect(page.locator("#wordle-input textarea, #wordle-input input").first).to_have_value("slate")
    keys.locator("[data-key=enter]").click()
    expect(page.locator("[data-testid=board] [data-mark]")).to_have_count(5)
    expect(status).to_contain_text("5 guesses left")


def test_policy_games_show_up_live_with_win_rate_by_version(url: str, page: Page) -> None:
    for version, moves in [(5, ["<guess>slate</guess>", "<guess>crane</guess>"]), (6, ["??"])]:
        eid = httpx.post(
            f"{url}/reset",
            json={"secret": "crane", "weight_version": version, "max_invalid_moves": 0, "kind": "training"},
            headers={"Authorization": "Bearer ui-test-token"},  # only the rollout's token labels policy games
        ).json()["observation"]["episode_id"]
        for move in moves:
            httpx.post(f"{url}/step", json={"episode_id": eid, "action": {"guess": move}})
    feed = page.locator("[data-testid=feed]")
    expect(feed).to_contain_text("policy v6", timeout=10_000)
    expect(feed).to_contain_text("lost (CRANE), 1 invalid move")
    expect(feed).to_contain_text("won in 2")
    assert feed.locator(".wordle-tile.green").count() == 2 + 5
    table = page.locator("#wordle-stats")
    expect(table).to_contain_text("policy v5\ntraining\n1\n1\n100%")  # a share, not 1 or 0
    expect(table).to_contain_text("policy v6\ntraining\n1\n0\n0%")
    expect(feed.locator("[data-testid=kind]").first).to_have_text("training game")


def test_the_status_announcer_gets_words_not_raw_i18n_keys(url: str) -> None:
    """Gradio's screen-reader status region said "common.complete"; the page now carries the words."""
    translations = httpx.get(f"{url}/config", timeout=30).json()["i18n_translations"]["en"]
    assert translations["common.complete"] == "Complete" and translations["common.error"] == "Error"
