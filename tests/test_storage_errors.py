"""The errors every bucket backend shares, each with its class, its message and whether it is retried: refused
credentials, a missing bucket, a private bucket read without a token, a server that asks to slow down (429), one
that fails or drops connections (5xx), and a batch call that applies only some of its entries.

The Hub's side runs against the local Hub (tests/local_hub: the real huggingface_hub and hf_xet, faults injected
per route); S3's against `rclone serve s3`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from delta import StorageError
from delta.errors import AccessDeniedError, BucketNotFoundError, BucketUnreachableError, RateLimitedError
from delta.storage import RetryPolicy, Storage, open_storage

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub
    from tests.rclone_server import RcloneS3Server

QUICK = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)


def hf(hub: LocalHub, bucket: str = "alice/run", user: str | None = "alice", scope: str = "write",
       **options: object) -> Storage:
    token = hub.token(user, scope) if user else False
    return open_storage(f"hf://buckets/{bucket}", token=token, endpoint=hub.endpoint, **{"retry": QUICK, **options})


def routes(hub: LocalHub) -> dict[str, int]:
    return hub.counts()["routes"]


# --- refused credentials: never retried ----------------------------------------------------------------------------


def test_a_read_token_that_writes_is_refused_once_and_says_what_to_do(local_hub: LocalHub,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    hf(local_hub).write("v/1", b"x")
    reader = hf(local_hub, scope="read", retry=RetryPolicy(attempts=5, first_delay=3.0))
    local_hub.reset_counts()
    for operation, call in [("write", lambda: reader.write("v/2", b"y")), ("delete", lambda: reader.delete(["v/1"])),
                            ("move", lambda: reader.move("v/1", "v/3"))]:
        with pytest.raises(AccessDeniedError) as info:
            call()
        assert "retrying" not in caplog.text, "a refused token is not retried"
        error = info.value
        assert isinstance(error, StorageError) and isinstance(error, PermissionError) and error.status == 403
        assert f"{operation} failed: the Hub refused the token (HTTP 403: Your token is read-only" in str(error)
        assert "needs write access to the bucket alice/run" in str(error) and "/settings/tokens" in str(error)
        assert local_hub.token("alice", "read") not in str(error)
    # the write token's refusal came from the Hub's Xet token route: nothing was uploaded, no batch sent
    assert routes(local_hub).get("api.xet_write_token") == 1 and "cas.xorb_grant" not in routes(local_hub)
    assert reader.read("v/1") == b"x"  # reading is what it may do


def test_an_invalid_or_revoked_token_is_refused_as_such(local_hub: LocalHub) -> None:
    hf(local_hub).write("f", b"x")
    revoked = local_hub.add_token("alice")
    local_hub.revoke_token(revoked)
    for token in ("hf_not_a_token", revoked):
        bucket = open_storage("hf://buckets/alice/run", token=token, endpoint=local_hub.endpoint)
        for call in (bucket.list, lambda: bucket.read("f"), lambda: bucket.write("g", b"y")):
            with pytest.raises(AccessDeniedError, match=r"the Hub refused the token \(HTTP 401: invalid credentials\): "
                                                        "it is wrong, expired or revoked"):
                call()


def test_xet_storage_refusing_the_token_is_retried_once_with_a_fresh_one_then_refused(local_hub: LocalHub) -> None:
    bucket = hf(local_hub)
    bucket.write("f", b"first")
    local_hub.add_fault(kind="expired_token", route="cas.reconstruction_v2", times=1)  # the kept token refused once
    assert bucket.read("f") == b"first"
    local_hub.add_fault(kind="expired_token", route="cas", times=None)  # every token refused
    with pytest.raises(AccessDeniedError, match="Xet storage") as info:
        bucket.read("f")
    assert info.value.status == 401
    local_hub.clear_faults()
    local_hub.add_fault(kind="status", route="api.xet_read_token", status=403, times=None,
                        message="Token has no access to Xet storage")
    fresh = hf(local_hub, scope="read")  # another token: none kept for it yet
    with pytest.raises(AccessDeniedError, match="HTTP 403: Token has no access to Xet storage"):
        fresh.read("f")


def test_s3_refused_credentials_are_the_same_error(rclone_s3: RcloneS3Server,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    options = rclone_s3.storage_options() | {"secret": "not-the-secret"}
    bucket = open_storage(f"s3://{rclone_s3.bucket}", retry=RetryPolicy(attempts=5, first_delay=3.0), **options)
    sent = bucket.traffic.snapshot().total.get("put", 0)
    with pytest.raises(AccessDeniedError, match="access denied by .*check the key and secret"):
        bucket.write("f", b"x")
    assert "retrying" not in caplog.text and bucket.traffic.snapshot().total["put"] == sent + 1  # sent once


# --- a missing bucket, a private one without a token ---------------------------------------------------------------


def test_a_missing_bucket_reads_as_empty_and_a_writer_that_may_not_create_it_is_told_how(
        local_hub: LocalHub, caplog: pytest.LogCaptureFixture) -> None:
    bucket = hf(local_hub, "alice/not-yet", create=False)
    assert bucket.list() == []
    with pytest.raises(BucketNotFoundError) as info:  # a FileNotFoundError: readers take it as "nothing yet"
        bucket.read("fleet/run.json")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(BucketNotFoundError) as info:
        bucket.write("manifests/0000000001.json", b"{}")
    assert "retrying" not in caplog.text  # not retried: it cannot come to exist by waiting
    assert "no bucket alice/not-yet on http://127.0.0.1" in str(info.value)
    assert "create it (`hf buckets create alice/not-yet`, or let the writer create it: create=True, `--create`)" in str(
        info.value)
    creator = hf(local_hub, "alice/not-yet")  # create=True, the default
    creator.write("manifests/0000000001.json", b"{}")
    assert bucket.read("manifests/0000000001.json") == b"{}"


def test_a_private_bucket_read_without_a_token_is_said_never_empty(local_hub: LocalHub) -> None:
    hf(local_hub, "alice/private", private=True).write("manifests/0000000001.json", b"{}")
    anonymous = hf(local_hub, "alice/private", user=None)
    for call in (anonymous.list, lambda: anonymous.read("manifests/0000000001.json")):
        with pytest.raises(AccessDeniedError, match="no token was sent: the bucket alice/private is private, or does "
                                                    "not exist; set HF_TOKEN"):
            call()
    # another user's token: the Hub answers as for a missing bucket (404), and the error says both
    with pytest.raises(BucketNotFoundError, match=r"no bucket alice/private on .* \(or the token cannot see it\)"):
        hf(local_hub, "alice/private", user="bob").read("manifests/0000000001.json")


# --- 429: waited out as the Hub says, shared, counted --------------------------------------------------------------


def test_a_429_holds_every_storage_sharing_its_traffic_back_until_the_time_the_hub_names(local_hub: LocalHub) -> None:
    bucket = hf(local_hub)
    bucket.write("f", b"x")
    other_bucket_same_token = hf(local_hub, "alice/other", traffic=bucket.traffic)  # what a `delta.Bucket` shares
    other_token = hf(local_hub, user="bob", bucket="bob/b")
    local_hub.add_fault(kind="status", route="api.tree_prefix", status=429, times=1,
                        rate_limit={"resource": "api", "remaining": 0, "reset": 2, "limit": 1000, "window": 300})
    local_hub.reset_counts()
    start = time.time()
    with pytest.raises(RateLimitedError) as info:
        bucket.list("v/")
    error = info.value
    assert isinstance(error, BucketUnreachableError)  # the loops that retry the unreachable wait for it too
    assert start + 2 <= error.retry_at <= time.time() + 2 * 1.1 + 1
    assert "rate-limited until" in str(error) and "HTTP 429 Too Many Requests (api quota 1000 per 300 s spent)" in str(
        error)
    assert routes(local_hub) == {"api.tree_prefix": 1}, "not asked again"
    for held in (lambda: bucket.read("f"), other_bucket_same_token.list):
        with pytest.raises(RateLimitedError, match="not sent: the server asked to slow down earlier"):
            held()
    assert routes(local_hub) == {"api.tree_prefix": 1}, "nothing sent while held"
    other_token.write("g", b"y")  # another traffic, another account's quota: not held
    snapshot = bucket.traffic.snapshot()
    assert snapshot.rate_limited == 1 and snapshot.throttled_until == error.retry_at
    assert snapshot.limits["api"].limit == 1000 and snapshot.limits["api"].remaining == 0
    time.sleep(max(0.0, error.retry_at - time.time()) + 0.05)
    assert bucket.read("f") == b"x" and bucket.traffic.snapshot().throttled_until is None


def test_a_429_without_a_time_waits_the_default_and_retry_after_is_read(local_hub: LocalHub) -> None:
    for rule, low, high in [({}, 60, 67), ({"retry_after": 5}, 5, 6)]:
        bucket = hf(local_hub, user="bob", bucket="bob/b") if rule else hf(local_hub)
        local_hub.add_fault(kind="status", route="api.tree_prefix", status=429, times=1, **rule)
        with pytest.raises(RateLimitedError) as info:
            bucket.list("v/")
        assert low <= info.value.retry_at - time.time() <= high


# --- 5xx and dropped connections: retried, then unreachable --------------------------------------------------------


def test_server_errors_and_dropped_bodies_are_retried_then_said_unreachable(local_hub: LocalHub) -> None:
    bucket = hf(local_hub)
    local_hub.add_fault(kind="status", route="api.batch", status=503, times=2)
    local_hub.add_fault(kind="drop", route="api.paths_info", times=1)
    bucket.write("f", b"landed")  # the storage's retries absorb both
    assert bucket.read("f") == b"landed"
    local_hub.add_fault(kind="status", route="api.paths_info", status=502, times=None)
    with pytest.raises(BucketUnreachableError, match="the bucket did not answer: the Hub answered HTTP 502") as info:
        bucket.read("f")
    assert not isinstance(info.value, RateLimitedError)


def test_a_hub_that_is_down_is_unreachable(own_local_hub: LocalHub) -> None:
    local_hub = own_local_hub
    bucket = hf(local_hub)
    bucket.write("f", b"x")
    local_hub.stop()
    with pytest.raises(BucketUnreachableError, match="cannot reach the Hub at http://127.0.0.1"):
        bucket.list()
    local_hub.start()
    assert bucket.read("f") == b"x"


# --- a batch that applies some of its entries ----------------------------------------------------------------------


def test_a_failed_batch_entry_is_an_error_worth_retrying(local_hub: LocalHub, tmp_path: Path) -> None:
    hf(local_hub).write("manifests/0000000000.json", b"{}")  # retried within the call: written
    hf(local_hub).delete(["manifests/0000000000.json"])
    bucket = hf(local_hub, retry=RetryPolicy(attempts=1))
    local_hub.add_fault(kind="batch_entry", route="api.batch", entry="manifests/", times=1,
                        message="internal error, try again")
    with pytest.raises(BucketUnreachableError, match=r"the Hub did not apply 1 operation\(s\) of the batch \(first: "
                                                     r"manifests/0000000001.json: internal error, try again\)"):
        bucket.write("manifests/0000000001.json", b"{}")
    assert bucket.list() == []
    bucket.write("manifests/0000000001.json", b"{}")
    assert bucket.read("manifests/0000000001.json") == b"{}"
