"""The rollout Space's UI in a real browser: Playwright drives Debian's chromium against a real rollout
service (transformers engine on a tiny model, following a local bucket) and a real env server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from delta import SubscriberConfig
import delta
from rollout_space.engines import EngineConfig, open_engine
from rollout_space.env_client import EnvClient
from rollout_space.follower import Follower
from rollout_space.server import build_app
from rollout_space.service import RolloutService, ServiceLimits
from rollout_space.ui import mount_ui

from ._engines import build_model, step
from ._env_server import running_server, serving
from .test_env_ui import CHROMIUM, CHROMIUM_ARGS

GUESSES = ["slate", "crony", "bumph", "wight", "fjord", "vaunt"]
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root: Path = tmp_path_factory.mktemp("rollout-ui")
    model = build_model(str(root / "model"), seed=5)
    bucket = str(root / "bucket")
    state = delta.load_state(model)
    publisher = delta.Publisher(bucket)
    publisher.publish(state)
    assert publisher.flush(timeout=60)
    engine = open_engine("transformers", EngineConfig(model, "auto", 1024))
    with running_server("env") as env_url:
        follower = Follower(engine, bucket, SubscriberConfig(poll_interval=0.1))
        service = RolloutService(engine, follower, EnvClient(env_url), ServiceLimits(max_tokens=16),
                                 model="tiny-qwen3", engine_kind="transformers")
        service.start()
        try:
            with serving(mount_ui(build_app(service), service, refresh_s=0.5)) as url:
                yield {"url": url, "service": service, "publisher": publisher, "state": state}
        finally:
            service.close()
            publisher.close()


@pytest.fixture()
def page(stack: dict[str, Any]) -> Iterator[Page]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test.sh does it with apt-get)")
    url = stack["url"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)  # a busy 2-core machine runs a policy game beside the page
        offsite: list[str] = []
        page.on("request", lambda r: offsite.append(r.url) if not r.url.startswith(url) else None)
        page.goto(url)
        expect(page.locator("#rollout-status")).to_contain_text("Serving v1", timeout=WAIT_MS)
        yield page
        browser.close()
        assert offsite == [], "the page must not fetch anything from outside the server"


def test_version_syncs_heatmap_and_policy_games(stack: dict[str, Any], page: Page) -> None:
    status = page.locator("#rollout-status")
    expect(status).to_contain_text("up to date with the trainer (v1)")
    expect(status).to_contain_text("engine transformers")
    expect(page.locator("#rollout-heatmap")).to_contain_text("No delta applied here yet")

    state = stack["state"]
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    stack["publisher"].publish(step(state, names, seed=3))
    assert stack["publisher"].flush(timeout=60)
    expect(status).to_contain_text("Serving v2")
    heatmap = page.locator("#rollout-heatmap")
    expect(heatmap).to_contain_text("Delta v1→v2")
    expect(heatmap.locator(".heatmaplayer image, .hm")).not_to_have_count(0)
    expect(heatmap).to_contain_text("q_proj")
    expect(heatmap).to_contain_text("layer 1")
    expect(page.locator("#rollout-timeline")).to_contain_text("apply pause (ms)")

    page.locator("#rollout-play-one").click()
    played = page.locator("[data-testid=played-game] [data-testid=policy-game]")
    expect(played).to_have_count(1)  # the game the button started, shown beside it
    expect(played).to_contain_text("what it wrote")
    episode = played.get_attribute("data-episode")
    feed = page.locator("[data-testid=policy-feed]")
    expect(feed.locator(f"[data-episode='{episode}']")).to_have_count(1)
    expect(feed.locator("[data-testid=policy-game]")).not_to_have_count(0)
    expect(feed).to_contain_text("policy v2")


def test_a_person_plays_the_policy_on_the_same_word(stack: dict[str, Any], page: Page) -> None:
    human = page.locator("#versus-status")
    policy_status = page.locator("#versus-policy-status")
    policy_tiles = page.locator("#versus-policy [data-mark]")
    before = {g.episode_id for g in stack["service"].recent_games(100)}
    expect(page.locator("#versus-exam")).to_contain_text(  # this server plays no fleet run: no exam of its own
        f"Your opponent: policy v{stack['service'].status().version} (served now")
    page.locator("#versus-new-match").click()
    expect(human).to_contain_text("6 guesses left")
    expect(policy_status).to_contain_text("has played", timeout=WAIT_MS)

    box = page.locator("#versus-input textarea, #versus-input input").first
    box.fill("zzzzz")
    box.press("Enter")
    expect(human).to_contain_text("Not accepted: 'zzzzz' is not in the word list.")
    seen_before_end: list[str] = []
    for n, word in enumerate(GUESSES, start=1):
        box.fill(word)
        box.press("Enter")
        expect(page.locator("[data-testid=board] [data-mark]")).to_have_count(5 * n)
        if "The word was" in human.inner_text():
            break
        seen_before_end += [page.locator("#versus-policy").inner_html(), page.locator("#rollout-feed").inner_html()]
        assert all(t.inner_text() == "" for t in policy_tiles.all()), "policy letters shown before the end"
    expect(human).to_contain_text("The word was")
    secret = human.locator("strong").inner_text().lower()
    assert len(secret) == 5

    expect(policy_status).to_contain_text(f"Policy v{stack['service'].status().version}: ")
    mine = [g for g in stack["service"].recent_games(100) if g.episode_id not in before]
    assert len(mine) == 1, "the match played one policy game"
    assert mine[0].secret in (secret, ""), "same seed, same word ('' when the game was cut by the context)"
    page.locator("#rollout-play-one").click()  # a public game: the feed is redrawn, the match game stays out
    feed = page.locator("[data-testid=policy-feed] [data-testid=policy-game]")
    expect(feed).to_have_count(len(before) + 1)
    assert feed.locator(f'xpath=self::*[@data-episode="{mine[0].episode_id}"]').count() == 0
    assert all(secret not in snapshot.lower() for snapshot in seen_before_end)
    words = [g for g in mine[0].guesses if g]
    expect(policy_tiles).to_have_count(5 * len(words))
    if words:
        assert policy_tiles.first.inner_text().lower() == words[0][0]
    assert httpx.get(stack["url"] + "/status").json()["engine"] == "transformers"  # the API beside the UI


def test_on_a_phone_the_match_comes_before_the_live_feed(stack: dict[str, Any]) -> None:
    """At 390 px the columns stack: the match to play must not sit below the whole live feed, and the page itself
    never scrolls sideways."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 1600})
            page.set_default_timeout(WAIT_MS)
            page.goto(stack["url"])
            match, feed = page.locator("#versus-new-match"), page.locator("#rollout-feed")
            expect(feed).to_be_attached()
            assert match.bounding_box()["y"] < feed.bounding_box()["y"]
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
        finally:
            browser.close()


def test_the_status_says_what_the_server_does_for_the_fleet() -> None:
    from wire.rollout import RolloutStatus
    from rollout_space.ui import status_markdown

    status = RolloutStatus(version=3, latest_version=3, lag=0, engine="transformers", device="cpu", model="m",
                           bucket="b", env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                           tokens_served=10, games_played=4, server_id="rollout-2", fleet_state="full",
                           fleet_run="20261124-065757-7e335009", groups_written=12)
    assert ("fleet server `rollout-2`: **full** for run `20261124-065757-7e335009` · 12 game groups handed in "
            "through the bucket") in status_markdown(status)
    assert "fleet server" not in status_markdown(status.model_copy(update={"server_id": None}))


def test_the_status_says_how_many_replies_straddled_two_weight_versions() -> None:
    from rollout_space.ui import status_markdown
    from wire.rollout import RolloutStatus

    status = RolloutStatus(version=3, latest_version=3, lag=0, engine="vllm", device="cpu", model="m", bucket="b",
                           env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                           tokens_served=10, games_played=4)
    assert "straddled" not in status_markdown(status)  # no game yet
    reported = status.model_copy(update={"versions_reported": True, "straddled": 1})
    assert "1 reply straddled two weight versions (each token's weight version as vLLM reported it)" in \
        status_markdown(reported)
    per_reply = status.model_copy(update={"versions_reported": False})
    assert ("0 replies straddled two weight versions (weight versions per reply: the engine reports none per token "
            "(it applies new weights between replies))") in status_markdown(per_reply)


def test_the_status_says_which_lora_run_the_server_follows() -> None:
    from rollout_space.ui import status_markdown
    from wire.lora import LoraSettings
    from wire.rollout import RolloutStatus

    status = RolloutStatus(version=3, latest_version=3, lag=0, engine="transformers", device="cpu", model="m",
                           bucket="b", env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                           tokens_served=10, games_played=4)
    assert "LoRA" not in status_markdown(status)
    lora = LoraSettings(sync="adapter", r=4, alpha=8, targets=("q_proj",), base_model="m", base_hash="sum128:" + "0" * 32)
    assert ("following LoRA r 4 (alpha 8) on q_proj, published as the adapter alone"
            in status_markdown(status.model_copy(update={"lora": lora})))


def test_the_status_says_which_adapters_the_engine_serves_and_counts_refusals_by_kind() -> None:
    from rollout_space.ui import status_markdown
    from wire.rollout import RolloutStatus

    status = RolloutStatus(version=3, latest_version=4, lag=1, engine="vllm", device="cpu", model="m", bucket="b",
                           env_url=None, last_error="the run's adapter has rank 16, above ...", state_hash=None,
                           failures=0, note=None, syncs=3, tokens_served=0, games_played=0)
    assert "refused" not in status_markdown(status)
    shown = status_markdown(status.model_copy(update={"refused": {"rank above max": 1, "bad adapter": 2},
                                                      "adapters": "LoRA adapters up to rank 8"}))
    assert "refused: bad adapter 2 · rank above max 1" in shown and "serves LoRA adapters up to rank 8" in shown


def test_the_status_says_whose_weights_are_served_and_what_was_refused() -> None:
    from rollout_space.ui import status_markdown
    from wire.rollout import RolloutStatus

    status = RolloutStatus(version=3, latest_version=4, lag=1, engine="transformers", device="cpu", model="m",
                           bucket="b", env_url=None, last_error=None, state_hash=None, failures=0, note=None, syncs=2,
                           tokens_served=10, games_played=1, trust="trainer key SHA256:abc (given)",
                           refused={"untrusted version": 1}, last_refusal="version 4: the signature does not match")
    page = status_markdown(status)
    assert "weights and run settings checked with the trainer key SHA256:abc (given)" in page
    assert "refused: untrusted version 1" in page and "**last refused:** version 4: the signature" in page
    unchecked = status_markdown(status.model_copy(update={"authenticated": False}))
    assert "**⚠ unauthenticated weights:**" in unchecked and "checked with" not in unchecked
