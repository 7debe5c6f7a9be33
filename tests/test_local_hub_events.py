"""The local Hub's bucket events feed (`tests/local_hub/events.py`, `event_routes.py`): its pure parts as tables, then
huggingface_hub's own client of the feed (`BucketFollower`, and `HfFileSystem(live_follow=True)` on top of it) against
the server in another process: each event, each resume point, each fault, each refusal, and what a stream costs.

Waits are bounded polls of what the client was handed; no assertion reads the wall clock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.local_hub.server import LocalHub

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: Bound on every wait for the client or the server: generous for a loaded machine, never reached when all is well.
WAIT_S = 30.0


def _until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


class Recorder:
    """What a `BucketFollower` hands its consumer, in order: each batch as `(path, op)` pairs, and "reconcile"."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.batches: list[list[Any]] = []  # the `BucketFileChange`s themselves
        self._lock = threading.Lock()

    def changes(self, batch: list[Any]) -> None:
        with self._lock:
            self.seen.append([(c.path, c.op) for c in batch])
            self.batches.append(batch)

    def reconcile(self) -> None:
        with self._lock:
            self.seen.append("reconcile")

    def wait_for(self, expected: list[Any]) -> None:
        """Wait until exactly `expected` was handed over (and fail at once on anything else)."""
        _until(lambda: self.seen[: len(expected)] != expected[: len(self.seen)] or self.seen == expected, f"{expected}")
        assert self.seen == expected


@contextlib.contextmanager
def following(hub: LocalHub, bucket: str, token: str | bool | None) -> Iterator[tuple[Any, Recorder]]:
    """huggingface_hub's follower of `bucket`, running until the block ends."""
    from huggingface_hub._bucket_live_follow import BucketFollower

    recorder = Recorder()
    follower = BucketFollower(endpoint=hub.endpoint, bucket_id=bucket, token=token, on_changes=recorder.changes,
                              on_reconcile=recorder.reconcile, is_alive=lambda: True)
    follower.start()
    try:
        yield follower, recorder
    finally:
        follower.stop()  # acted on at the stream's next ping


@pytest.fixture
def hub(local_hub: LocalHub) -> LocalHub:
    """The session's local Hub with a bucket `alice/b` holding `a/x`, pinging every 0.2 s (so that a stopped follower
    leaves at once)."""
    local_hub.settings(events_ping_s=0.2)
    api = local_hub.api("alice")
    api.create_bucket("alice/b")
    api.batch_bucket_files("alice/b", add=[(b"first", "a/x")])
    return local_hub


def _events(hub: LocalHub) -> list[tuple[str, int]]:
    """The events requests the server answered: their query and status, in order."""
    return [(r["query"], r["status"]) for r in hub.requests() if r["route"] == "api.bucket_events"]


# --- pure parts ----------------------------------------------------------------------------------


def test_each_change_is_reported_with_what_changed() -> None:
    from tests.local_hub.events import file_change
    from tests.local_hub.store import BucketFile

    old = BucketFile("h1", 5, mtime_ms=1_000, uploaded_at=2.0)
    times = {"uploadedAt": "1970-01-01T00:00:03.000Z", "mtime": "1970-01-01T00:00:01.000Z"}
    assert file_change("p", None, None) is None
    assert file_change("p", old, None) == {"path": "p", "op": "delete"}
    assert file_change("p", None, BucketFile("h1", 5, 1_000, 3.0)) == {
        "path": "p", "op": "add", "size": 5, "xetHash": "h1", **times}
    assert file_change("p", old, BucketFile("h2", 5, 1_000, 3.0)) == {
        "path": "p", "op": "update", "xetHash": "h2", "uploadedAt": times["uploadedAt"]}  # only what changed
    assert file_change("p", old, old) is None


def test_a_resume_point_replays_what_came_after_it_or_answers_reset() -> None:
    from tests.local_hub.events import EventLog, ResumeError, parse_resume

    log = EventLog(unknown_until=100.0)
    for at in (101.0, 102.0, 103.0, 104.0):
        log.append([{"path": f"p{at}", "op": "delete"}], at)
    log.prune(now=104.5, keep_s=2.0)  # drops the batches at 101 and 102
    assert (log.last, log.dropped, log.unknown_until) == (4, 2, 102.0)

    def replayed(cursor: str | None = None, since: str | None = None) -> list[int] | None:
        resume = parse_resume(cursor, since, "ep")
        batches = None if resume is None else log.replay(resume)
        return None if batches is None else [b.n for b in batches]

    assert replayed() == []  # live: what comes next
    assert replayed("ep.2") == [3, 4] and replayed("ep.4") == []
    assert replayed("ep.1") is None  # batch 2 was dropped
    assert replayed("ep.5") is None  # a batch this epoch never made
    assert replayed("other.3") is None  # another epoch: a restarted or reset Hub
    assert replayed("ep.0", since="1970-01-01T00:00:00Z") is None  # the cursor wins
    assert replayed(since="1970-01-01T00:01:42.000Z") == [3, 4]  # 102.0: nothing after it was dropped
    assert replayed(since="1970-01-01T00:01:43.000Z") == [4]  # strictly after the instant
    assert replayed(since="1970-01-01T00:01:41.999Z") is None  # the batch at 102 is gone
    for cursor, since in (("nonsense", None), ("ep.x", None), (None, "yesterday")):
        with pytest.raises(ResumeError):
            parse_resume(cursor, since, "ep")


# --- through huggingface_hub's client --------------------------------------------------------------


def test_each_batch_comes_once_in_order_and_a_stream_is_one_request(hub: LocalHub) -> None:
    api = hub.api("alice")
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        seen.wait_for(["reconcile"])  # no resume point yet: the consumer drops its view; `since` replays nothing
        hub.reset_counts()
        api.batch_bucket_files("alice/b", add=[(b"second", "a/y")], delete=["a/x"])
        api.batch_bucket_files("alice/b", copy=[("bucket", "alice/b", _hash(hub, "a/y"), "c/z")])
        api.batch_bucket_files("alice/b", delete=["never/there"])  # changes nothing: no event
        api.batch_bucket_files("alice/b", add=[(b"third", "a/y")])  # a new content at a path: an update
        api.batch_bucket_files("alice/b", add=[(b"third", "a/y")])  # the same content again
        seen.wait_for(["reconcile", [("a/y", "add"), ("a/x", "delete")], [("c/z", "add")], [("a/y", "update")],
                       [("a/y", "update")]])
        assert "api.bucket_events" not in hub.counts()["routes"]  # the stream was counted once, when it opened
    held = hub.state()["buckets"]["alice/b"]["files"]
    added, _ = seen.batches[0]
    assert (added.size, added.xet_hash) == (6, seen.batches[1][0].xet_hash)
    assert added.uploaded_at is not None and added.mtime is not None
    new_content, same_content = seen.batches[2][0], seen.batches[3][0]
    assert (new_content.size, new_content.xet_hash) == (5, held["a/y"]["xet_hash"])
    assert (same_content.size, same_content.xet_hash) == (None, None)  # unchanged: left out
    assert same_content.uploaded_at > new_content.uploaded_at


def _hash(hub: LocalHub, path: str) -> str:
    return hub.state()["buckets"]["alice/b"]["files"][path]["xet_hash"]


def test_a_failed_entry_is_left_out_of_the_batch(hub: LocalHub) -> None:
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="batch_entry", route="api.batch", entry="bad")
        from huggingface_hub.errors import BucketBatchError

        with pytest.raises(BucketBatchError):
            hub.api("alice").batch_bucket_files("alice/b", add=[(b"1", "ok"), (b"2", "bad")])
        seen.wait_for(["reconcile", [("ok", "add")]])


def test_a_server_reconnect_resumes_from_the_cursor_and_replays_what_came_between(hub: LocalHub) -> None:
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="delay", route="api.bucket_events", delay_s=3.0)  # the next stream opens late
        hub.add_fault(kind="stream_reconnect", route="api.bucket_events")  # the open one is rotated now
        _until(lambda: hub.faults()[1]["hits"] == 1, "the stream was rotated")
        hub.api("alice").batch_bucket_files("alice/b", delete=["a/x"])  # while no stream is open
        seen.wait_for(["reconcile", [("a/x", "delete")]])
    queries = [query for query, _ in _events(hub)]
    assert queries[0].startswith("since=") and queries[1].startswith("cursor=") and len(queries) == 2
    requests = hub.requests()
    batch_at = max(i for i, r in enumerate(requests) if r["route"] == "api.batch")
    reopened_at = [i for i, r in enumerate(requests) if r["route"] == "api.bucket_events"][1]
    assert batch_at < reopened_at  # the change came from the replay, not live


def test_a_resume_point_older_than_the_buffer_is_answered_reset_and_the_client_reconciles(hub: LocalHub) -> None:
    hub.settings(events_replay_s=0)  # nothing is kept once sent
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="delay", route="api.bucket_events", delay_s=3.0)
        hub.add_fault(kind="stream_reconnect", route="api.bucket_events")
        _until(lambda: hub.faults()[1]["hits"] == 1, "the stream was rotated")
        hub.api("alice").batch_bucket_files("alice/b", delete=["a/x"])  # made, and dropped, while away
        seen.wait_for(["reconcile", "reconcile"])  # told `reset`: its view is dropped, to be listed again
        _until(lambda: len(_events(hub)) == 3, "the client follows again")
        hub.api("alice").batch_bucket_files("alice/b", add=[(b"later", "a/later")])
        seen.wait_for(["reconcile", "reconcile", [("a/later", "add")]])
    queries = [query.split("=")[0] for query, _ in _events(hub)]
    assert queries == ["since", "cursor", "since"]  # the third from the bucket's `updatedAt`, probed again


def test_a_forced_reset_on_an_open_stream(hub: LocalHub) -> None:
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="stream_reset", route="api.bucket_events", message="buffer lost")
        seen.wait_for(["reconcile", "reconcile"])
        _until(lambda: len(_events(hub)) == 2, "the client follows again")
        hub.api("alice").batch_bucket_files("alice/b", delete=["a/x"])
        seen.wait_for(["reconcile", "reconcile", [("a/x", "delete")]])


def test_a_stream_cut_mid_event_loses_nothing_and_repeats_nothing(hub: LocalHub) -> None:
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="stream_cut", route="api.bucket_events", drop_fraction=0.6)
        hub.api("alice").batch_bucket_files("alice/b", delete=["a/x"])
        seen.wait_for(["reconcile", [("a/x", "delete")]])
        hub.api("alice").batch_bucket_files("alice/b", add=[(b"after", "a/after")])
        seen.wait_for(["reconcile", [("a/x", "delete")], [("a/after", "add")]])
    _, second = _events(hub)
    assert hub.faults()[0]["hits"] == 1 and second[0].startswith("cursor=")


def test_a_delayed_batch_keeps_its_place(hub: LocalHub) -> None:
    api = hub.api("alice")
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        hub.add_fault(kind="stream_delay", route="api.bucket_events", delay_s=2.0)
        api.batch_bucket_files("alice/b", delete=["a/x"])
        api.batch_bucket_files("alice/b", add=[(b"behind", "a/behind")])
        seen.wait_for(["reconcile", [("a/x", "delete")], [("a/behind", "add")]])
    assert len(_events(hub)) == 1  # delayed, not cut


@pytest.mark.parametrize(
    "case, status",
    [("feed off (501)", 501), ("feed off (404)", 404), ("anonymous, private bucket", 401),
     ("a stranger, private bucket", 404), ("a revoked token", 401), ("refused (403)", 403)],
)
def test_a_feed_that_cannot_be_followed_stops_the_client(hub: LocalHub, case: str, status: int) -> None:
    token: str | bool = hub.token("alice")
    if case.startswith("feed off"):
        hub.settings(events_off=status)
    elif case.startswith("anonymous"):
        hub.set_bucket("alice/b", private=True)
        token = False
    elif case.startswith("a stranger"):
        hub.set_bucket("alice/b", private=True)
        token = hub.token("bob")
    elif case == "a revoked token":
        token = hub.add_token("alice")
        hub.revoke_token(token)
    else:
        hub.add_fault(kind="status", route="api.bucket_events", status=403, times=None)
    with following(hub, "alice/b", token) as (follower, _seen):
        _until(lambda: not follower.is_alive(), "the client gives up")
    assert not follower.subscribed and [answered for _, answered in _events(hub)] == [status]


def test_a_503_with_retry_after_is_waited_out(hub: LocalHub) -> None:
    hub.add_fault(kind="status", route="api.bucket_events", status=503, retry_after=1)
    with following(hub, "alice/b", hub.token("alice")) as (follower, _):
        _until(lambda: follower.subscribed, "the follower is ready")
    assert [status for _, status in _events(hub)] == [503, 200]


def test_the_stream_as_sent(hub: LocalHub) -> None:
    """What the client cannot show: keep-alive comments, `ready`'s cursor, the refusals of bad requests."""
    url = f"{hub.endpoint}/api/buckets/alice/b/events"
    headers = {"Authorization": f"Bearer {hub.token('alice')}", "Accept": "text/event-stream"}
    hub.api("alice").create_bucket("alice/empty")
    with httpx.stream("GET", url.replace("/b/", "/empty/"), headers=headers, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        received = b""
        for chunk in response.iter_raw():
            received += chunk
            if b": ping" in received:
                break
    assert received.startswith(b"event: ready\ndata: {}\n\n")  # a feed that has seen no change: no cursor
    hub.add_fault(kind="stream_reconnect", route="api.bucket_events")
    reply = httpx.get(url, headers=headers, timeout=10)  # ends at once
    assert reply.text.startswith('event: reconnect\ndata: {"cursor":"') and reply.text.endswith('"}\n\n')
    assert httpx.get(url, headers={**headers, "Accept": "application/json"}).status_code == 406
    for query in ({"cursor": "nonsense"}, {"since": "yesterday"}):
        assert httpx.get(url, headers=headers, params=query).status_code == 400


def test_a_cursor_from_before_a_restart_is_answered_reset(own_local_hub: LocalHub) -> None:
    hub = own_local_hub
    hub.settings(events_ping_s=0.2)
    api = hub.api("alice")
    api.create_bucket("alice/b")
    with following(hub, "alice/b", hub.token("alice")) as (follower, seen):
        _until(lambda: follower.subscribed, "the follower is ready")
        api.batch_bucket_files("alice/b", add=[(b"first", "a/x")])
        seen.wait_for(["reconcile", [("a/x", "add")]])
        hub.restart()  # the feed's buffer is gone; the files stay
        seen.wait_for(["reconcile", [("a/x", "add")], "reconcile"])
        api.batch_bucket_files("alice/b", delete=["a/x"])
        seen.wait_for(["reconcile", [("a/x", "add")], "reconcile", [("a/x", "delete")]])


def test_hf_file_system_live_follow_sees_a_change_without_invalidating_by_hand(hub: LocalHub) -> None:
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=hub.endpoint, token=hub.token("alice"), live_follow=True, skip_instance_cache=True)
    assert fs.ls("buckets/alice/b/a", detail=False) == ["buckets/alice/b/a/x"]
    _until(lambda: len(_events(hub)) == 1 and _events(hub)[0][1] == 200, "the filesystem follows the bucket")
    hub.api("alice").batch_bucket_files("alice/b", add=[(b"new", "a/y")])
    _until(lambda: any(changes for _, changes in fs._pending_bucket_changes), "the change reached the filesystem")
    assert fs.ls("buckets/alice/b/a", detail=False) == ["buckets/alice/b/a/x", "buckets/alice/b/a/y"]
    assert fs.ls("buckets/alice/b/a", detail=False) == ["buckets/alice/b/a/x", "buckets/alice/b/a/y"]
    assert hub.counts()["routes"]["api.tree_prefix"] == 2  # listed first, then once after the change: the cache
