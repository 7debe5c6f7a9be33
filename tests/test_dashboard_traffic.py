"""The line each app's page shows about its bucket's requests, and the words a refused token or a rate limit leave
on the trainer's and the rollout server's pages."""

from __future__ import annotations

import time

from dashboard.traffic import traffic_text
from wire.traffic import BucketTraffic


def throttled() -> BucketTraffic:
    """A bucket held back for the next 90 s (made when a test runs: the suite may reach it minutes after collection)."""
    return BucketTraffic(last_5min={"api": 312, "resolver": 0, "transfer": 40}, total={"api": 900},
                         limit={"api": 1000}, remaining={"api": 0}, rate_limited=1, throttled_until=time.time() + 90,
                         throttled_by="the Hub answered HTTP 429 Too Many Requests (api quota 1000 per 300 s spent)")


REFUSED = ("hf://buckets/alice/run/v: write failed: the Hub refused the token (HTTP 403: Your token is read-only): it "
           "needs write access to the bucket alice/run")


def test_the_line_counts_by_class_against_the_limit_and_says_until_when_it_is_held() -> None:
    held = throttled()
    until = time.strftime("%H:%M:%S", time.localtime(held.throttled_until))
    assert traffic_text(held) == (
        "bucket requests, last 5 min: api 312 of 1,000 · transfer 40 · **rate-limited until "
        f"{until}** (the Hub answered HTTP 429 Too Many Requests (api quota 1000 per 300 s spent)) · 1 answer(s) 429 "
        "so far")
    quiet = BucketTraffic(last_5min={"read": 0, "write": 0}, total={})
    assert traffic_text(quiet) == "bucket requests, last 5 min: none"
    past = held.model_copy(update={"throttled_until": time.time() - 1})
    assert "rate-limited until" not in traffic_text(past) and "1 answer(s) 429 so far" in traffic_text(past)


def test_the_rollout_page_says_the_token_was_refused_and_the_bucket_throttled() -> None:
    from rollout_space.ui import status_markdown
    from wire.rollout import RolloutStatus

    status = RolloutStatus(version=3, latest_version=3, lag=0, engine="transformers", device="cpu", model="m",
                           bucket="b", env_url=None, last_error=f"AccessDeniedError: {REFUSED}", state_hash=None,
                           failures=4, note=None, syncs=2, tokens_served=10, games_played=4, bucket_traffic=throttled())
    page = status_markdown(status)
    assert "**last error:** AccessDeniedError: hf://buckets/alice/run/v: write failed: the Hub refused the token" in page
    assert "**rate-limited until " in page and "api 312 of 1,000" in page


def test_the_trainer_page_says_why_publishing_stopped_and_the_bucket_throttled(tmp_path) -> None:
    from trainer_space.config import TrainerConfig
    from trainer_space import build_session
    from trainer_space.ui import status_markdown

    status = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    assert "bucket requests, last 5 min:" in status_markdown(status)  # every page says what its bucket costs
    status = status.model_copy(update={"state": "stopped", "error": f"PublishError: publishing stopped: {REFUSED}",
                                       "bucket_traffic": throttled()})
    page = status_markdown(status)
    assert "**error:** PublishError: publishing stopped: hf://buckets/alice/run/v: write failed: the Hub refused" in page
    assert "**rate-limited until " in page
