"""delta.storage: one suite for the interface, run against every backend (a local directory, S3 for real through
`rclone serve s3`, Hugging Face buckets through the real huggingface_hub and hf_xet against the local Hub of
tests/local_hub), then each backend's own promises and failures. The errors every backend shares (refused
credentials, a missing bucket, a server that does not answer or asks to slow down) are in tests/test_storage_errors.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from delta import Bucket, DeltaError, StorageError
from delta.errors import BucketUnreachableError, FileTooLargeError
from delta.storage import (
    HfBucketStorage,
    LocalStorage,
    RetryPolicy,
    S3Storage,
    Storage,
    StoredFile,
    check_path,
    open_storage,
)
from delta.atomic import TMP_PREFIX
from delta.storage._fsspec import parse_s3_url
from delta.storage._hf import parse_hf_bucket_url
from tests._capped import HUGE, run_capped, sparse
from tests.rclone_server import RcloneS3Server

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub

# Retries that give up in well under a second, so failure tests stay fast.
QUICK = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)

OpenBucket = Callable[[str], Storage]


@pytest.fixture(params=["local", "s3", "hf"])
def open_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> OpenBucket:
    """Open `<bucket root>/<sub>` on the backend under test; the same root for every call in a test."""
    if request.param == "local":
        return lambda sub="": open_storage(str(tmp_path / "bucket" / sub), retry=QUICK)
    if request.param == "hf":
        hub: LocalHub = request.getfixturevalue("local_hub")
        return lambda sub="": open_storage(f"hf://buckets/alice/test-bucket/{sub}", retry=QUICK,
                                           token=hub.token("alice"), endpoint=hub.endpoint)
    server: RcloneS3Server = request.getfixturevalue("rclone_s3")
    return lambda sub="": open_storage(f"s3://{server.bucket}/{sub}", retry=QUICK, **server.storage_options())


def entries(files: list[StoredFile]) -> list[tuple[str, int]]:
    """A listing as (path, size) pairs: what every backend agrees on (the etag is each one's own)."""
    return [(f.path, f.size) for f in files]


@pytest.fixture
def bucket(open_bucket: OpenBucket) -> Storage:
    return open_bucket("runs/1")


# --- the shared suite ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data", [b"", bytes(range(256)), random.Random(0).randbytes(3 << 20)], ids=["empty", "bytes", "3MiB"]
)
def test_round_trip_is_bit_exact(bucket: Storage, data: bytes) -> None:
    bucket.write("deep/folder/file.bin", data)
    assert bucket.read("deep/folder/file.bin") == data


def test_overwrite_replaces_content_and_size(bucket: Storage) -> None:
    bucket.write("manifest.json", b"version 1, a longer first text")
    bucket.write("manifest.json", b"version 2")
    assert bucket.read("manifest.json") == b"version 2"
    assert entries(bucket.list()) == [("manifest.json", 9)]


def test_list_filters_by_string_prefix_sorted_with_sizes(bucket: Storage) -> None:
    for path, size in [("b", 4), ("a/2/x", 3), ("ab", 2), ("a/1", 1)]:
        bucket.write(path, b"z" * size)
    assert entries(bucket.list()) == [("a/1", 1), ("a/2/x", 3), ("ab", 2), ("b", 4)]
    assert [f.path for f in bucket.list("a/")] == ["a/1", "a/2/x"]
    assert [f.path for f in bucket.list("a")] == ["a/1", "a/2/x", "ab"]
    assert [f.path for f in bucket.list("a/2/")] == ["a/2/x"]
    assert bucket.list("c/") == []


def test_prefixes_of_one_bucket_do_not_see_each_other(open_bucket: OpenBucket) -> None:
    one, two, root = open_bucket("one"), open_bucket("two"), open_bucket("")
    one.write("x", b"1")
    two.write("x", b"22")
    assert entries(one.list()) == [("x", 1)]
    assert two.read("x") == b"22"
    assert entries(root.list()) == [("one/x", 1), ("two/x", 2)]


def test_delete_removes_the_given_files_and_skips_missing_ones(bucket: Storage) -> None:
    for path in ["keep", "v/1", "v/2"]:
        bucket.write(path, b"x")
    bucket.delete(["v/1", "v/2", "never/written"])
    bucket.delete([])
    assert [f.path for f in bucket.list()] == ["keep"]


def test_missing_file_raises_file_not_found(bucket: Storage) -> None:
    bucket.write("there", b"x")
    with pytest.raises(FileNotFoundError) as info:
        bucket.read("not/there")
    assert str(info.value) == f"'not/there' does not exist in {bucket.url}"
    assert info.value.__cause__ is not None


def test_a_folder_is_not_a_file(bucket: Storage) -> None:
    bucket.write("folder/file", b"x")
    with pytest.raises(FileNotFoundError):
        bucket.read("folder")


def test_move_takes_a_file_to_another_path_replacing_what_was_there(bucket: Storage) -> None:
    bucket.write("trainer/history.json", b"old history")
    bucket.write("aside/history.json", b"x")
    bucket.move("trainer/history.json", "aside/history.json")
    assert entries(bucket.list()) == [("aside/history.json", 11)]
    assert bucket.read("aside/history.json") == b"old history"
    with pytest.raises(FileNotFoundError):
        bucket.move("trainer/history.json", "elsewhere.json")
    with pytest.raises(ValueError, match="invalid bucket path"):
        bucket.move("aside/history.json", "../out")


def test_a_bounded_read_refuses_a_file_over_its_bound_and_reads_one_at_it(bucket: Storage) -> None:
    bucket.write("f", b"12345")
    bucket.write("empty", b"")
    assert bucket.read("f", max_bytes=5) == b"12345" and bucket.read("f", max_bytes=1 << 30) == b"12345"
    assert bucket.read("empty", max_bytes=0) == b""
    with pytest.raises(FileTooLargeError) as info:
        bucket.read("f", max_bytes=4)
    assert info.value.limit == 4 and info.value.path == "f" and info.value.size in (5, None)
    assert str(info.value).startswith(f"{bucket.url}/f: ") and "more than the 4 this file may hold" in str(info.value)
    assert isinstance(info.value, StorageError)  # callers that know StorageError still catch it
    with pytest.raises(FileNotFoundError):
        bucket.read("not/there", max_bytes=4)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        bucket.read("f", max_bytes=-1)


def test_a_listed_entry_reads_what_was_listed_and_its_etag_follows_the_content(bucket: Storage) -> None:
    bucket.write("m.json", b"first")
    [listed] = bucket.list("m.json")
    assert bucket.read("m.json", listed=listed) == b"first"
    bucket.write("m.json", b"other")  # same size, other bytes
    [again] = bucket.list("m.json")
    assert again.size == listed.size
    assert again.etag is None or again.etag != listed.etag  # a local folder names no content
    assert bucket.read("m.json", listed=again) == b"other"
    with pytest.raises(FileTooLargeError) as info:  # refused by its listed size, unread
        bucket.read("m.json", max_bytes=4, listed=again)
    assert info.value.size == 5
    with pytest.raises(ValueError, match="not of 'n.json'"):
        bucket.read("n.json", listed=again)


def test_the_pollers_of_a_bucket_object_share_one_listing_that_holds_its_changes(open_bucket: OpenBucket) -> None:
    clock = [0.0]
    bucket = Bucket(open_bucket("shared"), clock=lambda: clock[0])  # the one object every poller of a role holds
    stranger = Bucket(open_bucket("shared"))  # another process: a listing of its own
    bucket.write("fleet/a", b"1")
    assert entries(bucket.list("fleet/", max_age=60)) == [("fleet/a", 1)]
    sent = sum(bucket.traffic.snapshot().total.values())
    assert entries(bucket.list("manifests/", max_age=60)) == []  # the same listing: nothing sent
    assert sum(bucket.traffic.snapshot().total.values()) == sent
    assert bucket.listed("fleet/a") is not None and bucket.listed("fleet/b") is None
    bucket.write("fleet/c", b"333")  # its own changes are in it at once
    bucket.delete(["fleet/a"])
    assert entries(bucket.list("fleet/", max_age=60)) == [("fleet/c", 3)]
    bucket.move("fleet/c", "fleet/d")
    assert entries(bucket.list("fleet/", max_age=60)) == [("fleet/d", 3)]
    assert bucket.read("fleet/d", listed=bucket.listed("fleet/d")) == b"333"
    # a file written elsewhere shows in a fresh listing, and in the shared one once it is older than asked
    stranger.write("fleet/e", b"55555")
    assert [p for p, _ in entries(bucket.list("fleet/", max_age=60))] == ["fleet/d"]
    assert [p for p, _ in entries(bucket.list("fleet/"))] == ["fleet/d", "fleet/e"]
    clock[0] += 0.3
    assert [p for p, _ in entries(bucket.list("fleet/", max_age=0.2))] == ["fleet/d", "fleet/e"]


def test_every_backend_counts_its_requests(bucket: Storage) -> None:
    before = sum(bucket.traffic.snapshot().total.values())
    bucket.write("f", b"x")
    bucket.read("f")
    bucket.list()
    after = bucket.traffic.snapshot()
    assert sum(after.total.values()) >= before + 3 and sum(after.last_window.values()) >= 3
    assert set(bucket.traffic.classes) <= set(after.total) and after.throttled_until is None


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_2_gb_file_costs_a_bounded_read_no_memory(backend: str, tmp_path: Path) -> None:
    """Under a memory cap that reading the file whole breaks, a bounded read refuses it, and an unbounded one fails:
    the proof that the cap bites."""
    root = tmp_path / ("bucket" if backend == "local" else "s3/test-bucket")
    sparse(root / "huge.json", HUGE, b'{"a": 1}')
    (root / "small.json").write_bytes(b"{}")
    server = RcloneS3Server(tmp_path / "s3") if backend == "s3" else None
    url = str(tmp_path / "bucket") if server is None else "s3://test-bucket"
    setup = (f"from delta.storage import FileTooLargeError, open_storage\n"
             f"bucket = open_storage({url!r}, **{server.storage_options() if server else {}!r})\n"
             "bucket.read('small.json', max_bytes=10)")
    body = ("try:\n    bucket.read('huge.json', max_bytes=1 << 20)\n"
            "except FileTooLargeError as e:\n    print('refused:', e)\n"
            "print('small:', bucket.read('small.json', max_bytes=10))\n"
            "try:\n    bucket.read('huge.json')\nexcept MemoryError:\n    print('whole: MemoryError')\n"
            "except Exception as e:\n    print('whole:', type(e).__name__, e)")
    with server or contextlib.nullcontext():
        done = run_capped(setup, body)
    assert "refused: " in done.stdout and "more than the 1,048,576 this file may hold" in done.stdout, done.stdout
    assert "small: b'{}'" in done.stdout
    assert "whole: " in done.stdout and "whole: None" not in done.stdout, done.stdout  # the cap bites


def test_a_bucket_not_created_yet_is_empty_until_the_first_write(open_bucket: OpenBucket) -> None:
    fresh = open_bucket("")
    assert fresh.list() == []
    with pytest.raises(FileNotFoundError):
        fresh.read("manifest.json")
    fresh.delete(["manifest.json"])
    fresh.write("manifest.json", b"{}")
    assert fresh.read("manifest.json") == b"{}"


BAD_PATHS = {
    "": "it is empty",
    "/etc/passwd": "it is absolute; paths are relative to the bucket root",
    "../outside": "it has an empty, '.' or '..' part",
    "a/../../b": "it has an empty, '.' or '..' part",
    "a//b": "it has an empty, '.' or '..' part",
    "./a": "it has an empty, '.' or '..' part",
    "dir/": "it has an empty, '.' or '..' part",
    "a\\b": "it holds a backslash, a control character or one of *?[]",
    "v*": "it holds a backslash, a control character or one of *?[]",
    "a\nb": "it holds a backslash, a control character or one of *?[]",
}


@pytest.mark.parametrize("path", BAD_PATHS)
def test_bad_paths_are_rejected_before_any_call(bucket: Storage, path: str) -> None:
    message = re.escape(
        f"invalid bucket path {path!r}: {BAD_PATHS[path]}. Use a relative path like 'versions/00000001.json'"
    )
    for call in (lambda: bucket.read(path), lambda: bucket.write(path, b"x"), lambda: bucket.delete(["ok", path])):
        with pytest.raises(ValueError, match=message):
            call()
    if path not in ("", "dir/"):  # both are fine as a listing prefix
        with pytest.raises(ValueError, match=message):
            bucket.list(path)


def test_write_takes_bytes_only(bucket: Storage) -> None:
    with pytest.raises(TypeError, match=re.escape("write() takes bytes, got bytearray; pass bytes(data)")):
        bucket.write("f", bytearray(b"x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("got bytearray for 'g'; pass bytes(data)")):
        bucket.write_many({"f": b"x", "g": bytearray(b"y")})  # type: ignore[dict-item]
    assert bucket.list() == []  # refused before anything was written


def test_write_many_writes_each_file_as_write_does(bucket: Storage) -> None:
    shared = Bucket(bucket)
    shared.write("groups/a", b"old")
    files = {"groups/a": b"new a", "groups/b": b"", "groups/deep/c": bytes(range(256)) * 40}
    shared.write_many(files)
    shared.write_many({})  # nothing to write: no call
    assert entries(bucket.list("groups/")) == sorted((p, len(d)) for p, d in files.items())
    assert {p: bucket.read(p) for p in files} == files
    assert entries(shared.list("groups/", max_age=60)) == entries(bucket.list("groups/"))  # the shared listing too
    with pytest.raises(ValueError, match="invalid bucket path"):
        shared.write_many({"ok": b"x", "../out": b"y"})
    assert shared.listed("ok") is None and "ok" not in {f.path for f in bucket.list()}  # checked before any call


# --- local directory -----------------------------------------------------------------------------


def test_local_url_forms_all_open_the_same_directory(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "bucket"
    opened = [open_storage(str(folder)), open_storage(folder), open_storage(f"file://{folder}")]
    assert all(isinstance(s, LocalStorage) and s.url == folder.as_uri() for s in opened)
    assert folder.is_dir()


def test_local_write_replaces_the_file_instead_of_rewriting_it(tmp_path: Path) -> None:
    bucket = LocalStorage(tmp_path)
    bucket.write("f", b"old")
    with open(tmp_path / "f", "rb") as reader:  # a reader in the middle of the old version
        bucket.write("f", b"new content")
        assert reader.read() == b"old"
    assert bucket.read("f") == b"new content"
    assert os.listdir(tmp_path) == ["f"]  # no temporary file left


def test_local_temporary_files_of_a_crashed_writer_are_hidden(tmp_path: Path) -> None:
    bucket = LocalStorage(tmp_path)
    bucket.write("v/1", b"x")
    (tmp_path / "v" / f"{TMP_PREFIX}0123").write_bytes(b"half a fi")
    assert bucket.list() == [StoredFile("v/1", 1)]
    with pytest.raises(ValueError, match="reserved"):
        bucket.write(f"v/{TMP_PREFIX}0123", b"x")


def test_local_names_planted_as_folders_or_fifos_are_no_files(tmp_path: Path) -> None:
    """A folder at a file's name refuses the write (FileExistsError, nothing written into it); a FIFO is not listed
    and reads as missing at once, never waited on."""
    bucket = LocalStorage(tmp_path)
    (tmp_path / "m").mkdir()
    with pytest.raises(FileExistsError, match="^write 'm' in file://.* refused: a folder holds its name$"):
        bucket.write("m", b"x")
    assert list((tmp_path / "m").iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    bucket.write("f", b"x")
    assert bucket.list() == [StoredFile("f", 1)]
    with pytest.raises(FileNotFoundError):
        bucket.read("fifo", max_bytes=10)
    bucket.write("fifo", b"y")  # replaced by a file, as any name is
    assert bucket.read("fifo") == b"y"


def test_local_disk_errors_become_storage_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StorageError) as info:
        LocalStorage(tmp_path / "file" / "bucket")
    assert str(info.value).startswith(f"{(tmp_path / 'file' / 'bucket').as_uri()}: cannot create the bucket directory:")
    assert isinstance(info.value, DeltaError) and isinstance(info.value, OSError)


# --- S3 through rclone serve s3 ------------------------------------------------------------------


def test_local_links_that_leave_the_bucket_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not the bucket's")
    root = tmp_path / "bucket"
    bucket = open_storage(str(root))
    bucket.write("versions/a", b"inside")
    (root / "versions" / "link").symlink_to(outside / "secret")
    (root / "versions" / "inner").symlink_to(root / "versions" / "a")  # a link that stays inside is fine
    (root / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FileNotFoundError):
        bucket.read("versions/link")
    with pytest.raises(FileNotFoundError):
        bucket.read("out/secret")
    assert bucket.read("versions/inner") == b"inside"
    for write in (lambda: bucket.write("out/new", b"x"), lambda: bucket.delete(["out/secret"])):
        with pytest.raises(StorageError, match="a link that leaves the bucket"):
            write()
    assert sorted(p.name for p in outside.iterdir()) == ["secret"] and (outside / "secret").read_bytes() == b"not the bucket's"


def test_s3_url_parsing() -> None:
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    assert parse_s3_url("s3://bucket/") == ("bucket", "")
    assert parse_s3_url("s3://bucket/runs/a/") == ("bucket", "runs/a/")
    with pytest.raises(ValueError, match=re.escape("no bucket name in 's3://'; expected s3://bucket[/prefix]")):
        parse_s3_url("s3://")
    assert S3Storage("s3://bucket/runs/a/", endpoint_url="http://127.0.0.1:9").url == "s3://bucket/runs/a"


@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
def test_s3_stopped_server_is_unreachable_then_works_again_after_restart(own_rclone_s3: RcloneS3Server,
                                                                        kill: bool) -> None:
    rclone_s3 = own_rclone_s3
    bucket = open_storage("s3://test-bucket", retry=QUICK, **rclone_s3.storage_options())
    bucket.write("v/1", b"before")
    rclone_s3.stop(kill=kill)
    for operation, call in [
        ("read", lambda: bucket.read("v/1")),
        ("write", lambda: bucket.write("v/2", b"x")),
        ("list", lambda: bucket.list()),
        ("delete", lambda: bucket.delete(["v/1"])),
    ]:
        with pytest.raises(BucketUnreachableError) as info:
            call()
        error = info.value
        assert isinstance(error, StorageError) and isinstance(error, ConnectionError)
        assert error.attempts == QUICK.attempts and error.url == "s3://test-bucket"
        assert re.match(
            rf"s3://test-bucket(/v/\d)?: {operation} failed after 3 attempt\(s\) over \d+\.\d s, the bucket did not "
            rf"answer: cannot reach {rclone_s3.endpoint_url}: .*Check that the server is up",
            str(error),
        ), str(error)
    rclone_s3.start()
    assert bucket.read("v/1") == b"before"
    bucket.write("v/2", b"after")
    assert [f.path for f in bucket.list()] == ["v/1", "v/2"]


def test_s3_hung_server_times_out_then_recovers(own_rclone_s3: RcloneS3Server) -> None:
    rclone_s3 = own_rclone_s3
    retry = RetryPolicy(attempts=2, first_delay=0.05)
    bucket = open_storage("s3://test-bucket", timeout=0.5, retry=retry, **rclone_s3.storage_options())
    bucket.write("f", b"x")
    rclone_s3.pause()
    for call in (lambda: bucket.write("g", b"y"), lambda: bucket.read("f"), lambda: bucket.list()):
        with pytest.raises(BucketUnreachableError, match="failed after 2 attempt") as info:
            call()
        assert info.value.attempts == 2 and "did not answer" in str(info.value)  # each attempt ended by `timeout`
    rclone_s3.resume()
    assert bucket.read("f") == b"x"
    bucket.write("h", b"z")
    assert bucket.read("h") == b"z"


def test_s3_wrong_secret_is_a_storage_error_and_not_retried(
    rclone_s3: RcloneS3Server, caplog: pytest.LogCaptureFixture
) -> None:
    options = rclone_s3.storage_options() | {"secret": "not-the-secret"}
    bucket = open_storage(f"s3://{rclone_s3.bucket}", retry=RetryPolicy(attempts=5, first_delay=3.0), **options)
    for operation, call in [("list", lambda: bucket.list()), ("write", lambda: bucket.write("f", b"x"))]:
        with pytest.raises(StorageError) as info:
            call()
        assert not isinstance(info.value, BucketUnreachableError)
        assert f"{operation} failed: access denied by {rclone_s3.endpoint_url}" in str(info.value)
        assert "AWS_SECRET_ACCESS_KEY" in str(info.value) and "not-the-secret" not in str(info.value)
    assert "retrying" not in caplog.text


def test_s3_endpoint_and_credentials_from_the_environment(
    rclone_s3: RcloneS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in rclone_s3.env().items():
        monkeypatch.setenv(name, value)
    bucket = open_storage(f"s3://{rclone_s3.bucket}/p", retry=QUICK)
    assert isinstance(bucket, S3Storage) and bucket.endpoint_url == rclone_s3.endpoint_url
    bucket.write("f", b"from env")
    assert (rclone_s3.root / rclone_s3.bucket / "p" / "f").read_bytes() == b"from env"


# --- Hugging Face buckets (no Hub here) ----------------------------------------------------------


def test_hf_url_parsing() -> None:
    assert parse_hf_bucket_url("hf://buckets/ns/name") == ("ns/name", "")
    assert parse_hf_bucket_url("hf://buckets/ns/name/runs/a/") == ("ns/name", "runs/a/")
    with pytest.raises(ValueError, match=re.escape("not a Hugging Face bucket URL: 'hf://ns/model'")):
        parse_hf_bucket_url("hf://ns/model")
    for url in ("hf://buckets/ns", "hf://buckets//name"):
        with pytest.raises(ValueError, match=re.escape(f"no bucket name in {url!r}")):
            parse_hf_bucket_url(url)


def test_hf_calls_stop_where_the_connection_is_made_and_show_no_token() -> None:
    """Each call goes through the storage's own client up to the network, is retried as any unreachable bucket, and
    says where it could not connect; the token shows nowhere."""
    token = "hf_do_not_leak_this_token"
    endpoint = "unreachable://hub.invalid"
    bucket = open_storage("hf://buckets/ns/name/runs/a", endpoint=endpoint, token=token, retry=QUICK)
    no_create = HfBucketStorage("hf://buckets/ns/name", endpoint=endpoint, token=token, create=False, retry=QUICK)
    assert isinstance(bucket, HfBucketStorage) and bucket.url == "hf://buckets/ns/name/runs/a"
    assert token not in repr(bucket)
    for call in (
        lambda: bucket.read("v/1"),  # download_bucket_files
        lambda: bucket.read("v/1", max_bytes=10),  # get_bucket_file_metadata
        lambda: no_create.move("v/1", "v/2"),  # get_bucket_file_metadata, then batch_bucket_files(copy=...)
        lambda: bucket.write("v/1", b"x"),  # create_bucket
        lambda: no_create.write("v/1", b"x"),  # batch_bucket_files(add=...), through hf_xet
        lambda: bucket.list("v/"),  # list_bucket_tree
        lambda: bucket.delete(["v/1", "v/2"]),  # batch_bucket_files(delete=...)
    ):
        with pytest.raises(BucketUnreachableError) as info:
            call()
        assert f"the bucket did not answer: cannot reach the Hub at {endpoint}" in str(info.value)
        assert token not in str(info.value)


def test_hf_client_settings_go_to_one_place() -> None:
    from huggingface_hub import HfApi

    with pytest.raises(ValueError, match="not both"):
        HfBucketStorage("hf://buckets/ns/name", api=HfApi(), token="x")


# --- choosing a backend, shared rules ------------------------------------------------------------


def test_unknown_schemes_are_refused_with_the_forms_that_work() -> None:
    with pytest.raises(ValueError) as info:
        open_storage("gs://bucket")
    assert str(info.value) == (
        "unsupported bucket URL 'gs://bucket': use a directory path, file:///abs/path, s3://bucket[/prefix] "
        "or hf://buckets/<namespace>/<name>[/prefix]"
    )


def test_check_path_accepts_what_the_layers_above_write() -> None:
    for path in ["manifest.json", "versions/00000001/delta-00000.safetensors", ".hidden", "a b/ü"]:
        assert check_path(path) == path
    assert check_path("", prefix=True) == "" and check_path("versions/", prefix=True) == "versions/"


def test_retry_policy_is_checked() -> None:
    with pytest.raises(ValueError, match=re.escape("RetryPolicy.attempts must be at least 1 (1 = no retry), got 0")):
        RetryPolicy(attempts=0)
    policy = RetryPolicy(first_delay=1.0, max_delay=3.0)
    for attempt, longest in [(1, 1.0), (2, 2.0), (3, 3.0), (9, 3.0)]:
        assert longest / 2 <= policy.delay(attempt) <= longest
