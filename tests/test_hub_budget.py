"""What a reader and a publisher cost a Hub account, counted by the local Hub (tests/local_hub, the real
huggingface_hub and hf_xet): a reader at rest asks one cheap request per poll and downloads nothing; a published and a
followed version each cost the small constant docs/fleet.md states, whatever the bucket holds."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from delta import Publisher, PublisherConfig, Subscriber, SubscriberConfig
from delta.bucket.retention import OLD_MANIFESTS_BATCH
from delta.storage import open_storage
from tests._states import states_equal
from tests._trainer import trajectory
from tests.test_wire_fleet import group
from wire.fleet_bucket import FleetBucket

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


def test_a_reader_at_rest_asks_at_most_one_request_per_poll_and_downloads_nothing(local_hub: LocalHub) -> None:
    with Publisher(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint) as pub:
        pub.publish(trajectory(1, n=2000)[1])
    polls = SubscriberConfig(poll_interval=0.5, idle_poll_max=4.0)
    with Subscriber(BUCKET, token=reader(local_hub), endpoint=local_hub.endpoint, config=polls) as sub:
        assert sub.sync() == 1
        local_hub.reset_counts()
        sub.start()
        time.sleep(60)
    seen = local_hub.counts()
    routes = seen["user_routes"].get("reader", {})
    assert set(routes) <= {"api.tree"}, routes  # listings only: no paths-info, no Xet token, nothing downloaded
    # one listing per poll, and the polls stretched to 4 s while nothing comes: 0.5, 1, 2, 4, 4, ... (~17 in 60 s)
    assert 10 <= routes.get("api.tree", 0) <= 20, routes
    assert sub.status().failures == 0


def test_a_published_and_a_followed_version_each_cost_a_constant(local_hub: LocalHub) -> None:
    states = trajectory(12, n=2000)
    polls = SubscriberConfig(poll_interval=0.2, idle_poll_max=0.2)
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
    fleet = FleetBucket(open_storage(BUCKET, token=local_hub.token("alice"), endpoint=local_hub.endpoint))
    fleet.write_group(group(seq=0))  # the bucket created, a Xet write token fetched: once per process
    local_hub.reset_counts()
    batch = [group(seq=seq) for seq in range(1, 5)]
    assert fleet.write_groups(batch) == [g.path for g in batch]
    routes = local_hub.counts()["user_routes"]["alice"]
    assert {r: n for r, n in routes.items() if r.startswith("api.")} == {"api.batch": 1}, routes
    assert [fleet.read_group(g.path) for g in batch] == batch
