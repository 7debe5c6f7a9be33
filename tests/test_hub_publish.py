"""A publisher and its readers on a Hugging Face bucket when the Hub misbehaves (the local Hub of tests/local_hub,
the real huggingface_hub and hf_xet): a batch that applies only some of its entries, a 429, a refused token, a
missing bucket, a private bucket read without a token. The publisher retries what can be retried and stops with a
clear error on what cannot; no reader ever sees a partial version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from delta import Bucket
from delta import PublishError, Publisher, PublisherConfig, Subscriber, SubscriberConfig, read_manifest
from tests._trainer import trajectory
from tests._states import states_equal

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub

QUICK = PublisherConfig(retry_delay=0.1, max_retry_delay=0.5)


def url(name: str = "alice/run") -> str:
    return f"hf://buckets/{name}"


def test_a_half_failed_batch_is_published_again_and_no_reader_sees_a_partial_version(local_hub: LocalHub) -> None:
    hub = {"endpoint": local_hub.endpoint}
    states = trajectory(3, n=5000)
    reader = Subscriber(url(), token=local_hub.token("alice", "read"), config=SubscriberConfig(poll_interval=0.05),
                        **hub)
    reader.start()
    seen: list[int] = []
    try:
        with Publisher(url(), QUICK, token=local_hub.token("alice"), **hub) as pub:
            pub.publish(states[1])
            assert pub.flush(60)
            # the next version's manifest entry fails once, then its delta file's
            local_hub.add_fault(kind="batch_entry", route="api.batch", entry="manifests/", times=1)
            pub.publish(states[2])
            assert pub.flush(60) and pub.last.version == 2
            local_hub.add_fault(kind="batch_entry", route="api.batch", entry="delta-r", times=1)
            pub.publish(states[3])
            assert pub.flush(60) and pub.last.version == 3
        assert reader.wait_for(3, 60)
        for stats in reader.status().history:
            seen.append(stats.version)
        with reader.lock:
            assert states_equal(reader.state, states[3])
    finally:
        reader.close()
    assert reader.status().failures == 0, reader.status().last_error  # nothing partial was ever offered
    manifest = read_manifest(Bucket.open(url(), token=local_hub.token("alice"), **hub))
    assert [v.version for v in manifest.versions] == [1, 2, 3]
    assert all(f.path for v in manifest.versions for f in v.files)
    assert local_hub.faults()[0]["hits"] == 1 and local_hub.faults()[1]["hits"] == 1


def test_a_429_is_waited_out_as_the_hub_says_then_the_version_commits(local_hub: LocalHub) -> None:
    states = trajectory(2, n=2000)
    with Publisher(url(), QUICK, token=local_hub.token("alice"), endpoint=local_hub.endpoint) as pub:
        pub.publish(states[1])
        assert pub.flush(60)
        local_hub.add_fault(kind="status", route="api.batch", status=429, times=1,
                            rate_limit={"resource": "api", "remaining": 0, "reset": 2, "limit": 1000, "window": 300})
        local_hub.reset_counts()
        pub.publish(states[2])
        assert pub.flush(60) and pub.last.version == 2
        assert pub.storage.traffic.snapshot().rate_limited == 1
        # the 429'd batch call, then none while the Hub's time held every call of the process (`Storage` sends
        # nothing before it: tests/test_storage_errors.py), then the delta's and the manifest's
        assert local_hub.counts()["routes"].get("api.batch") == 3


@pytest.mark.parametrize("case", ["read token", "missing bucket"])
def test_what_cannot_be_retried_stops_the_publisher_at_once_with_what_to_do(local_hub: LocalHub, case: str,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    if case == "read token":
        local_hub.api("alice").create_bucket("alice/run")
        pub = Publisher(url(), QUICK, token=local_hub.token("alice", "read"), endpoint=local_hub.endpoint)
        said = "the Hub refused the token (HTTP 403: Your token is read-only"
    else:
        pub = Publisher(url("alice/absent"), QUICK, token=local_hub.token("alice"), endpoint=local_hub.endpoint,
                        create=False)
        said = "no bucket alice/absent on"
    pub.publish(trajectory(1, n=1000)[1])
    with pytest.raises(PublishError, match="publishing to hf://buckets/alice/.* stopped: ") as info:
        pub.flush(60)  # raised: stopped at once (retrying, it would still be trying when the flush timed out)
    assert said in str(info.value) and "retrying" not in caplog.text
    with pytest.raises(PublishError):  # closing says it again
        pub.close(5)
    assert read_manifest(Bucket.open(url(), token=local_hub.token("alice"), endpoint=local_hub.endpoint)) is None


def test_a_reader_of_a_private_bucket_without_a_token_says_so(local_hub: LocalHub) -> None:
    with Publisher(url(), QUICK, token=local_hub.token("alice"), endpoint=local_hub.endpoint, private=True) as pub:
        pub.publish(trajectory(1, n=1000)[1])
    anonymous = Subscriber(url(), token=False, endpoint=local_hub.endpoint)
    with pytest.raises(Exception, match="no token was sent: the bucket alice/run is private"):
        anonymous.sync()
    assert "AccessDeniedError" in anonymous.status().last_error
