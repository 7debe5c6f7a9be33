"""What a reader and a publisher cost a Hub account, counted by the local Hub (tests/local_hub, the real
huggingface_hub and hf_xet): a reader at rest asks one cheap request per poll and downloads nothing; a published and a
followed version each cost the small constant docs/fleet.md states, whatever the bucket holds."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from delta import Bucket, Publisher, PublisherConfig, Subscriber, SubscriberConfig
from delta.bucket.retention import OLD_MANIFESTS_BATCH
from delta.follow import FollowConfig, ServerFollower
from delta.poll import Backoff
from fleet.bucket import FleetBucket
from tests._states import states_equal
from tests._trainer import trajectory
from tests.test_wire_fleet import _beat, group

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub

BUCKET = "hf://buckets/team/run"
#: API-class requests of a published delta version: one listing (commit number and garbage), the delta's batch call,
#: the manifest's (old manifests are deleted eight at a time, one more call; a Xet token once per its lifetime).
PUBLISH_API = 3
#: API-class requests of a followed delta version: the listing that shows its manifest (the manifest and the delta
#: are read by their listed entries, Xet storage alone).
FOLLOW_API = 1


def reader(hub: LocalHub, name: str = "reader") -> str:
    """A read token of a user of its own (the local Hub counts per user), a member of the bucket's org."""
    hub.add_user(name, ["team"])
    return hub.add_token(name, "read")


def test_a_reader_at_rest_asks_one_listing_per_poll_and_downloads_nothing(local_hub: LocalHub) -> None:
    """Each look of a reader at rest costs exactly one listing; how often it looks is `delta.poll.Backoff`'s schedule
    (tests/test_poll.py), and the two together, measured over minutes, are `python -m bench.hub_requests`'s."""
    with Publisher(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint) as pub:
        pub.publish(trajectory(1, n=2000)[1])
    with Subscriber(BUCKET, token=reader(local_hub), endpoint=local_hub.endpoint) as sub:
        assert sub.sync() == 1
        local_hub.reset_counts()
        for _ in range(5):  # five looks, as the follow loop makes them: nothing new in any
            assert sub.sync() == 1
    routes = local_hub.counts()["user_routes"].get("reader", {})
    # one listing a look (of the manifests, or of the whole bucket where the process's pollers share one): no
    # paths-info, no Xet token, nothing downloaded
    assert set(routes) <= {"api.tree", "api.tree_prefix"} and sum(routes.values()) == 5, routes
    assert sub.status().failures == 0


def looks_at_rest(backoff: Backoff, seconds: float) -> int:
    """How many looks a poller makes in its first `seconds` of rest on `backoff`'s schedule (a look at once, then one
    after each wait; none finds anything new): the schedule through a clock of the test's own, no waiting."""
    at, looks = 0.0, 0
    while at <= seconds:
        looks += 1
        backoff.succeeded(changed=False)
        at += backoff.delay()
    return looks


def test_with_default_settings_a_subscriber_and_delta_follow_at_rest_cost_at_most_3_api_requests_a_minute(
        local_hub: LocalHub, tmp_path) -> None:
    """The library's defaults follow the bucket's kind (`Bucket.budget`: the Hub's here). A look at rest costs exactly
    one listing; the looks of five minutes of rest, on the schedule each builds from its defaults, are at most 15."""
    with Publisher(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint) as pub:
        pub.publish(trajectory(1, n=2000)[1])
    now = [0.0]  # the shared listing's clock: each look comes a poll interval after the one before, as in the loop
    subscriber = Subscriber(Bucket.open(BUCKET, token=reader(local_hub, "sub"), endpoint=local_hub.endpoint,
                                        clock=lambda: now[0]))
    follower = ServerFollower(FollowConfig(BUCKET, "http://127.0.0.1:1"),
                              bucket=Bucket.open(BUCKET, token=reader(local_hub, "follow"), endpoint=local_hub.endpoint))
    following = follower._subscriber()  # what `delta follow` looks with, once the server holds the bucket's state
    def subscriber_look() -> int | None:
        now[0] += subscriber.config.poll_interval
        return subscriber.sync(max_age=subscriber.config.poll_interval)  # as its follow loop looks

    for look, name in ((subscriber_look, "sub"), (following.sync, "follow")):
        assert look() == 1
        local_hub.reset_counts()
        for _ in range(4):
            assert look() == 1
        assert local_hub.counts()["users"][name] == {"api": 4}, "one listing a look, nothing else"
    for loop in (subscriber.backoff(), follower.backoff()):
        assert looks_at_rest(loop, 300) <= 3 * 5
    assert looks_at_rest(Subscriber(str(tmp_path)).backoff(), 60) == 61  # a folder's: every second
    subscriber.close()
    follower.close()


def test_a_published_and_a_followed_version_each_cost_a_constant(local_hub: LocalHub) -> None:
    states = trajectory(12, n=2000)
    polls = SubscriberConfig(poll_interval=0.2, idle_poll_max=0.2, version_interval=0.2)  # versions come every second here
    with Publisher(BUCKET, PublisherConfig(anchor_every=1000), token=local_hub.token("alice"),
                   endpoint=local_hub.endpoint) as pub, \
            Subscriber(BUCKET, token=reader(local_hub), endpoint=local_hub.endpoint, config=polls) as sub:
        for version, state in enumerate(states[1:4], start=1):  # an anchor, then deltas: Xet tokens kept
            pub.publish(state)
            assert pub.flush(60)
        sub.start()
        assert sub.wait_for(3, 60)
        spent = 0
        for version, state in enumerate(states[4:], start=4):  # more versions: the cost does not grow with them
            time.sleep(0.5)  # the reader at rest between versions
            local_hub.reset_counts()
            pub.publish(state)
            assert pub.flush(60)
            seen = local_hub.counts()
            published, routes = seen["users"]["alice"], seen["user_routes"]["alice"]
            assert sub.wait_for(version, 60)
            followed = local_hub.counts()["users"]["reader"]
            polls_meanwhile = local_hub.counts()["user_routes"]["reader"].get("api.tree", 0)
            assert published.get("api", 0) <= PUBLISH_API + 1, routes  # + 1: old manifests' batch delete
            spent += published.get("api", 0)
            assert published.get("resolver", 0) == 0
            # listings only (one per poll), one of which showed the version: nothing else asked of the API
            assert followed.get("api", 0) == polls_meanwhile >= FOLLOW_API, followed
            assert followed.get("resolver", 0) == 0
        with sub.lock:
            assert states_equal(sub.state, states[-1])
    measured = len(states) - 4
    assert spent <= PUBLISH_API * measured + measured // OLD_MANIFESTS_BATCH + 1


def test_a_rollout_servers_batch_of_groups_costs_one_request(local_hub: LocalHub) -> None:
    fleet = FleetBucket(Bucket.open(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint))
    fleet.write_group(group(seq=0))  # the bucket created, a Xet write token fetched: once per process
    local_hub.reset_counts()
    batch = [group(seq=seq) for seq in range(1, 5)]
    assert fleet.write_groups(batch) == [g.path for g in batch]
    routes = local_hub.counts()["user_routes"]["alice"]
    assert {r: n for r, n in routes.items() if r.startswith("api.")} == {"api.batch": 1}, routes
    assert [fleet.read_group(g.path) for g in batch] == batch


def test_a_heartbeat_costs_one_request_and_reading_one_unchanged_costs_none(local_hub: LocalHub) -> None:
    """A server's heartbeat is one batch call; the trainer's look at the heartbeats is the shared listing, and a
    heartbeat listed unchanged since it was read last is not read again."""
    fleet = FleetBucket(Bucket.open(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint))
    fleet.write_heartbeat(_beat())  # the bucket created, a Xet write token fetched: once per process
    local_hub.reset_counts()
    fleet.write_heartbeat(_beat().model_copy(update={"beat": 2}))
    assert {r: n for r, n in local_hub.counts()["routes"].items() if r.startswith("api.")} == {"api.batch": 1}
    [listed] = fleet.bucket.list("fleet/servers/")
    assert fleet.read_heartbeat(listed.path, listed).beat == 2
    local_hub.reset_counts()
    assert fleet.read_heartbeat(listed.path, listed).beat == 2  # listed with the content it had: not read again
    assert local_hub.counts()["classes"]["api"] == 0 and local_hub.counts()["classes"]["cas"] == 0
