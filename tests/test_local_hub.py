"""The local Hub (`tests/local_hub/`): its pure parts as tables, then the real huggingface_hub and hf_xet against
it: buckets, writes and bit-exact reads, dedup, copies and moves, each auth error as the client raises it, each fault
kind as the client sees it, counts by class, a restart, and `delta`'s own hf:// backend.

Nothing here stubs a client: every call goes through `HfApi` and hf_xet over HTTP to a server in another process.
hf_xet retries a CAS 5xx for minutes (3 s base delay, 5 attempts), so CAS faults here are 4xx or happen once.
"""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.local_hub.server import LocalHub

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _random(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _floats(count: int) -> bytes:
    """Compressible bytes (a smooth float32 series) so hf_xet picks an LZ4 scheme and the server must decode it."""
    return b"".join(struct.pack("<f", i * 0.001) for i in range(count))


def _download(api: Any, bucket: str, paths: list[str], folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    targets = [(path, folder / path.replace("/", "__")) for path in paths]
    api.download_bucket_files(bucket, targets, raise_on_missing_files=True)
    return {path: target.read_bytes() for path, target in targets}


# --- pure parts ----------------------------------------------------------------------------------


def test_xet_hash_hex_prints_little_endian_words() -> None:
    from tests.local_hub.xet_formats import hash_hex

    assert hash_hex(bytes(range(32))) == "0706050403020100" "0f0e0d0c0b0a0908" "1716151413121110" "1f1e1d1c1b1a1918"


def _chunk(body: bytes, scheme: int, unpacked: int) -> bytes:
    return bytes([0]) + len(body).to_bytes(3, "little") + bytes([scheme]) + unpacked.to_bytes(3, "little") + body


def _lz4_frame(*blocks: tuple[bytes, bool]) -> bytes:
    """An LZ4 frame (no checksums, linked blocks) from (block, raw) pairs."""
    out = bytearray(b"\x04\x22\x4d\x18" + bytes([0x40, 0x40, 0x00]))
    for block, raw in blocks:
        out += (len(block) | (0x80000000 if raw else 0)).to_bytes(4, "little") + block
    return bytes(out + b"\x00\x00\x00\x00")


def test_xorb_chunks_are_found_and_decoded_under_each_scheme() -> None:
    from tests.local_hub.chunk_codec import decode_chunks
    from tests.local_hub.xet_formats import parse_xorb

    # "xyz" then a match 3 back of length 9 (overlapping), then the literal "!": LZ4 token 0x35, offset 3, token 0x10
    lz4 = _lz4_frame((b"\x35xyz\x03\x00\x10!", False))
    grouped = _lz4_frame((b"aebfcgd", True))  # "abcdefg" split in 4 lanes: a e | b f | c g | d
    xorb = _chunk(b"plain", 0, 5) + _chunk(lz4, 1, 13) + _chunk(grouped, 2, 7) + b"XETBLOB\x01 footer"
    layout = parse_xorb(xorb)
    assert layout.offsets == (0, 13, 13 + 8 + len(lz4), 13 + 16 + len(lz4) + len(grouped))
    assert layout.unpacked == (5, 13, 7) and layout.schemes == (0, 1, 2)
    assert decode_chunks(xorb, layout, 0, 3) == b"plain" + b"xyzxyzxyzxyz!" + b"abcdefg"
    assert decode_chunks(xorb, layout, 1, 2) == b"xyzxyzxyzxyz!"


def test_bad_xorbs_are_refused_with_the_reason() -> None:
    from tests.local_hub.xet_formats import XetFormatError, parse_xorb

    with pytest.raises(XetFormatError, match="runs past the end"):
        parse_xorb(_chunk(b"abc", 0, 3)[:-1])
    with pytest.raises(XetFormatError, match="unknown compression scheme 7"):
        parse_xorb(_chunk(b"abc", 7, 3))
    with pytest.raises(XetFormatError, match="at least one chunk"):
        parse_xorb(b"XETBLOB")


def _entry(raw_hash: bytes, *words: int) -> bytes:
    return raw_hash + struct.pack("<IIII", *words)


def test_shard_file_info_maps_a_file_to_xorb_chunk_ranges() -> None:
    from tests.local_hub.xet_formats import SHARD_TAG, hash_hex, parse_shard

    file_hash, xorb_a, xorb_b, bookend = bytes([1]) * 32, bytes([2]) * 32, bytes([3]) * 32, b"\xff" * 32
    shard = SHARD_TAG + struct.pack("<QQ", 2, 200)
    shard += file_hash + struct.pack("<IIQ", 1 << 31, 2, 0)  # two segments, with verification entries
    shard += _entry(xorb_a, 0, 100, 0, 3) + _entry(xorb_b, 0, 40, 5, 6)
    shard += _entry(bytes(32), 0, 0, 0, 0) * 2  # the verification entries, skipped
    shard += _entry(bookend, 0, 0, 0, 0)
    shard += _entry(xorb_a, 0, 3, 500, 0) + _entry(bytes(32), 0, 10, 0, 0) * 3 + _entry(bookend, 0, 0, 0, 0)
    parsed = parse_shard(shard)
    (file,) = parsed.files
    assert file.file_hash == hash_hex(file_hash) and file.size == 140
    assert [(s.xorb, s.start, s.end, s.unpacked) for s in file.segments] == [
        (hash_hex(xorb_a), 0, 3, 100), (hash_hex(xorb_b), 5, 6, 40)
    ]
    assert [(x.xorb, x.num_chunks, x.num_bytes) for x in parsed.xorbs] == [(hash_hex(xorb_a), 3, 500)]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    from tests.local_hub.store import Store

    store = Store(tmp_path / "state")
    store.add_user("alice", ["team"])
    store.add_user("bob")
    for value, user, scope in [("aw", "alice", "write"), ("ar", "alice", "read"), ("bw", "bob", "write"),
                               ("gone", "bob", "write")]:
        store.add_token(user, scope, value)  # type: ignore[arg-type]
    store.revoke_token("gone")
    store.create_bucket("alice/priv", private=True)
    store.create_bucket("alice/pub", private=False)
    store.create_bucket("team/shared", private=True)
    return store


ACCESS_TABLE = [
    # (token, check, bucket) -> (status, X-Error-Code) or None when allowed
    (None, "read", "alice/pub", None),
    (None, "read", "alice/priv", (401, "RepoNotFound")),
    (None, "read", "alice/nope", (404, "RepoNotFound")),
    (None, "write", "alice/pub", (401, None)),
    ("aw", "read", "alice/priv", None),
    ("aw", "write", "alice/priv", None),
    ("aw", "write", "team/shared", None),
    ("ar", "read", "alice/priv", None),
    ("ar", "write", "alice/priv", (403, None)),
    ("bw", "read", "alice/priv", (404, "RepoNotFound")),
    ("bw", "read", "team/shared", (404, "RepoNotFound")),
    ("bw", "read", "alice/pub", None),
    ("bw", "write", "alice/pub", (403, None)),
    ("bw", "create", "bob", None),
    ("bw", "create", "team", (403, None)),
    ("aw", "create", "team", None),
    ("ar", "create", "alice", (403, None)),
    (None, "create", "alice", (401, None)),
    ("gone", "read", "alice/pub", (401, None)),
    ("nonsense", "read", "alice/pub", (401, None)),
]


@pytest.mark.parametrize(("token", "check", "target", "expected"), ACCESS_TABLE)
def test_access_decisions(store: Any, token: str | None, check: str, target: str, expected: Any) -> None:
    from tests.local_hub import access

    caller = access.caller_from_header(store, f"Bearer {token}" if token else None)
    if check == "create":
        refusal = access.check_create(store, caller, target)
    else:
        decide = access.check_read if check == "read" else access.check_write
        refusal = decide(store, caller, target, store.buckets.get(target))
    assert ((refusal.status, refusal.code) if refusal else None) == expected
    if token in ("gone", "nonsense"):
        assert refusal is not None and refusal.message == "Invalid credentials in Authorization header"


def test_tree_listing_levels_and_pages(store: Any) -> None:
    from tests.local_hub.listing import page_after, tree_entries
    from tests.local_hub.store import BucketFile

    bucket = store.buckets["alice/pub"]
    for path in ["a/1", "a/2/x", "a/2/y", "ab", "b"]:
        bucket.files[path] = BucketFile("h", 1, 0, 0.0)
    shape = lambda entries: [(e["type"][0], e["path"]) for e in entries]  # noqa: E731
    assert shape(tree_entries(bucket, "", recursive=False)) == [("d", "a"), ("f", "ab"), ("f", "b")]
    assert shape(tree_entries(bucket, "a", recursive=False)) == [("f", "a/1"), ("d", "a/2"), ("f", "ab")]
    assert shape(tree_entries(bucket, "a/", recursive=False)) == [("f", "a/1"), ("d", "a/2")]
    assert [p for _, p in shape(tree_entries(bucket, "a", recursive=True))] == ["a/1", "a/2/x", "a/2/y", "ab"]
    entries = tree_entries(bucket, "", recursive=True)
    first, cursor = page_after(entries, None, 2)
    second, cursor2 = page_after(entries, cursor, 2)
    third, cursor3 = page_after(entries, cursor2, 2)
    assert [e["path"] for e in first + second + third] == ["a/1", "a/2/x", "a/2/y", "ab", "b"]
    assert (cursor, cursor2, cursor3) == ("a/2/x", "ab", None)


def test_fault_rules_match_by_route_class_method_and_path_and_run_out() -> None:
    from tests.local_hub.faults import FaultBook

    book = FaultBook()
    book.add({"kind": "status", "route": "cas.*", "times": 2})
    book.add({"kind": "delay", "route": "api", "method": "post", "path_contains": "/batch", "times": None})
    take = lambda route, cls, method="GET", path="/x": book.take(("status", "delay"), route, cls, method, path)  # noqa: E731
    assert take("api.batch", "api") is None  # GET
    assert take("api.batch", "api", "POST", "/api/buckets/a/b/batch").kind == "delay"
    assert take("cas.xorb_bytes", "cas").kind == "status"
    assert take("cas.dedup_query", "cas").kind == "status"
    assert take("cas.dedup_query", "cas") is None  # two times, spent
    assert [r["hits"] for r in book.snapshot()] == [2, 1]
    with pytest.raises(ValueError, match="unknown fault kind"):
        book.add({"kind": "explode"})
    with pytest.raises(ValueError, match="needs 'entry'"):
        book.add({"kind": "batch_entry"})


def test_quota_counts_fixed_windows_per_user_and_class() -> None:
    from tests.local_hub.quota import Quota

    quota, config = Quota(), {"window_s": 300, "api": 2}
    assert quota.check(config, "alice", "api", 600.0) == (
        True, {"RateLimit": '"api";r=1;t=300', "RateLimit-Policy": '"fixed window";"api";q=2;w=300'}
    )
    assert quota.check(config, "alice", "api", 700.0)[0] is True
    allowed, headers = quota.check(config, "alice", "api", 750.0)
    assert not allowed and headers["RateLimit"] == '"api";r=0;t=150'
    assert quota.check(config, "bob", "api", 750.0)[0] is True
    assert quota.check(config, "alice", "cas", 750.0) == (True, {})
    assert quota.check(config, "alice", "api", 900.0)[0] is True  # a new window


# --- the real clients ----------------------------------------------------------------------------


def test_write_list_and_read_back_bit_exact(local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub.settings(page_size=2)
    api = local_hub.api("alice")
    assert api.create_bucket("alice/b1", private=True).bucket_id == "alice/b1"
    files = {
        "empty": b"",
        "small.txt": b"hello",
        "deep/3MiB.bin": _random(3 << 20, 1),
        "deep/floats.f32": _floats(300_000),
        "deep/a b#1?.txt": b"odd name",
    }
    api.batch_bucket_files("alice/b1", add=[(data, path) for path, data in files.items()])
    listed = {f.path: f for f in api.list_bucket_tree("alice/b1", recursive=True)}
    assert {p: f.size for p, f in listed.items()} == {p: len(d) for p, d in files.items()}
    under = [f.path for f in api.list_bucket_tree("alice/b1", prefix="deep/a b#", recursive=True)]
    assert under == ["deep/a b#1?.txt"]
    assert [f.path for f in api.list_bucket_tree("alice/b1", prefix="deep", recursive=True)] == sorted(
        p for p in files if p.startswith("deep/")
    )
    routes = local_hub.counts()["routes"]
    assert (routes["api.tree"], routes["api.tree_prefix"]) == (3, 3)  # pages of two: 5 files, then 1, then 3
    assert _download(api, "alice/b1", list(files), tmp_path / "out") == files
    state = local_hub.state()
    chunks = {p: state["xet_files"][listed[p].xet_hash]["chunks"] for p in files if files[p]}
    assert chunks["deep/3MiB.bin"] > 16 and chunks["deep/floats.f32"] > 4, chunks
    for path, data in files.items():  # what the server stored, decoded by the server itself
        assert local_hub.file_bytes("alice/b1", path) == data
    info = api.bucket_info("alice/b1")
    assert (info.private, info.size, info.total_files) == (True, sum(map(len, files.values())), 5)


def test_a_second_file_sharing_content_uploads_only_its_new_chunks(local_hub: LocalHub, tmp_path: Path) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/dedup")
    base = _random(2 << 20, 2)
    api.batch_bucket_files("alice/dedup", add=[(base, "first")])
    stored = local_hub.state()["xorbs"]["bytes"]
    api.batch_bucket_files("alice/dedup", add=[(base + _random(100_000, 3), "second")])
    grown = local_hub.state()["xorbs"]["bytes"] - stored
    assert 100_000 <= grown < 500_000, grown  # the new tail and the chunk it changed, not 2 MiB again
    listed = {f.path: f.xet_hash for f in api.list_bucket_tree("alice/dedup")}
    state = local_hub.state()["xet_files"]
    assert set(state[listed["first"]]["xorbs"]) <= set(state[listed["second"]]["xorbs"])
    assert _download(api, "alice/dedup", ["first", "second"], tmp_path) == {
        "first": base, "second": base + _random(100_000, 3)
    }


def test_overwrite_copy_move_and_delete(local_hub: LocalHub, tmp_path: Path) -> None:
    from huggingface_hub.errors import BucketBatchError, BucketNotFoundError

    api = local_hub.api("alice")
    api.create_bucket("alice/src")
    api.create_bucket("team/dst", private=True)
    api.batch_bucket_files("alice/src", add=[(b"version 1, the longer one", "f")])
    api.batch_bucket_files("alice/src", add=[(b"version 2", "f")])
    meta = api.get_bucket_file_metadata("alice/src", "f")
    (listed,) = api.list_bucket_tree("alice/src")
    assert (meta.size, meta.xet_file_data.file_hash) == (9, listed.xet_hash)
    assert meta.xet_file_data.refresh_route == f"{local_hub.endpoint}/api/buckets/alice/src/xet-read-token"
    api.batch_bucket_files("team/dst", copy=[("bucket", "alice/src", listed.xet_hash, "copied/f")])
    assert _download(api, "team/dst", ["copied/f"], tmp_path / "a") == {"copied/f": b"version 2"}
    api.batch_bucket_files("alice/src", copy=[("bucket", "alice/src", listed.xet_hash, "g")], delete=["f"])  # a move
    assert [f.path for f in api.list_bucket_tree("alice/src")] == ["g"]
    with pytest.raises(BucketBatchError, match=r"1 out of 1 .*\n  - h: xet hash 0+ not found in bucket alice/src"):
        api.batch_bucket_files("alice/src", copy=[("bucket", "alice/src", "0" * 64, "h")])
    api.batch_bucket_files("alice/src", delete=["g", "never/there"])
    assert list(api.list_bucket_tree("alice/src")) == [] and api.bucket_info("alice/src").total_files == 0
    api.delete_bucket("alice/src")
    with pytest.raises(BucketNotFoundError):
        api.bucket_info("alice/src")
    api.move_bucket("team/dst", "alice/moved")
    assert _download(api, "alice/moved", ["copied/f"], tmp_path / "b") == {"copied/f": b"version 2"}


def test_resolve_answers_head_and_ranged_get(local_hub: LocalHub) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/r", private=True)
    data = _floats(50_000)
    api.batch_bucket_files("alice/r", add=[(data, "dir/w.f32")])
    auth = {"Authorization": f"Bearer {local_hub.token('alice', 'read')}"}
    url = f"{local_hub.endpoint}/buckets/alice/r/resolve/dir/w.f32"
    head = httpx.head(url, headers=auth)
    assert head.status_code == 200 and int(head.headers["x-linked-size"]) == len(data)
    assert head.headers["link"] == f'<{local_hub.endpoint}/api/buckets/alice/r/xet-read-token>; rel="xet-auth"'
    assert head.headers["etag"] == f'"{head.headers["x-xet-hash"]}"'
    assert httpx.get(url, headers=auth).content == data
    ranged = httpx.get(url, headers={**auth, "Range": "bytes=1000-1999"})
    assert ranged.status_code == 206 and ranged.content == data[1000:2000]
    assert ranged.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
    assert local_hub.counts()["classes"]["resolver"] == 3


def test_each_auth_error_as_huggingface_hub_raises_it(local_hub: LocalHub, tmp_path: Path) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        BucketNotFoundError,
        EntryNotFoundError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    alice, read, bob, anon = local_hub.api("alice"), local_hub.api("alice", "read"), local_hub.api("bob"), local_hub.api(None)
    bad = HfApi(endpoint=local_hub.endpoint, token="hf_not_a_token")
    alice.create_bucket("alice/priv", private=True)
    alice.create_bucket("alice/pub")
    alice.batch_bucket_files("alice/priv", add=[(b"secret", "s")])
    alice.batch_bucket_files("alice/pub", add=[(b"public", "p")])
    revoked = local_hub.add_token("bob")
    local_hub.revoke_token(revoked)
    gone = HfApi(endpoint=local_hub.endpoint, token=revoked)
    creds = "Invalid credentials in Authorization header"
    table: list[tuple[str, Callable[[], Any], type[BaseException] | None, str]] = [
        ("missing bucket", lambda: alice.bucket_info("alice/nope"), BucketNotFoundError, "404 Client Error"),
        ("private, no token", lambda: anon.bucket_info("alice/priv"), BucketNotFoundError, "401 Client Error"),
        ("private, stranger", lambda: bob.bucket_info("alice/priv"), BucketNotFoundError, "404 Client Error"),
        ("bad token, private", lambda: bad.bucket_info("alice/priv"), HfHubHTTPError, creds),
        ("bad token, public", lambda: bad.list_bucket_tree("alice/pub").__iter__().__next__(), HfHubHTTPError, creds),
        ("revoked token", lambda: gone.bucket_info("alice/pub"), HfHubHTTPError, creds),
        ("public, no token", lambda: anon.bucket_info("alice/pub"), None, ""),
        ("read token creates", lambda: read.create_bucket("alice/new"), HfHubHTTPError, "403 Forbidden: Your token is"),
        ("read token, exist_ok", lambda: read.create_bucket("alice/pub", exist_ok=True), None, ""),
        ("exists", lambda: alice.create_bucket("alice/pub"), HfHubHTTPError, "409 Conflict"),
        ("exists, exist_ok", lambda: alice.create_bucket("alice/pub", exist_ok=True), None, ""),
        ("read token deletes", lambda: read.batch_bucket_files("alice/pub", delete=["p"]), HfHubHTTPError, "403"),
        # hf_xet fetches the write token itself and reports the Hub's 403 as a builtin ConnectionError
        ("read token adds", lambda: read.batch_bucket_files("alice/pub", add=[(b"x", "x")]), ConnectionError,
         "403 Forbidden"),
        ("stranger writes", lambda: bob.batch_bucket_files("alice/pub", delete=["p"]), HfHubHTTPError,
         "don't have the rights"),
        ("stranger, org", lambda: bob.create_bucket("team/x"), HfHubHTTPError, "403 Forbidden"),
        ("member, org", lambda: alice.create_bucket("team/x"), None, ""),
        ("private download, no token", lambda: anon.download_bucket_files("alice/priv", [("s", tmp_path / "s")]),
         BucketNotFoundError, "401 Client Error"),
        # the resolve route is not under /api/buckets/: huggingface_hub calls that a repository
        ("private metadata, no token", lambda: anon.get_bucket_file_metadata("alice/priv", "s"),
         RepositoryNotFoundError, "401 Client Error"),
        ("missing file metadata", lambda: alice.get_bucket_file_metadata("alice/pub", "nope"),
         RemoteEntryNotFoundError, "Entry Not Found"),
        ("missing file download", lambda: alice.download_bucket_files(
            "alice/pub", [("nope", tmp_path / "n")], raise_on_missing_files=True), EntryNotFoundError, "not found"),
        ("delete missing, missing_ok", lambda: alice.delete_bucket("alice/nope", missing_ok=True), None, ""),
    ]
    wrong = []
    for name, call, expected, fragment in table:
        try:
            call()
            raised: BaseException | None = None
        except Exception as error:  # noqa: BLE001 - each row checks what it got
            raised = error
        if expected is None and raised is not None:
            wrong.append(f"{name}: raised {type(raised).__name__}: {raised}")
        elif expected is not None and (type(raised) is not expected or fragment not in str(raised)):
            wrong.append(f"{name}: expected {expected.__name__} with {fragment!r}, got {type(raised).__name__}: {raised}")
    assert not wrong, "\n".join(wrong)


def test_a_503_twice_on_batch_is_absorbed_by_huggingface_hub_retries(local_hub: LocalHub) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/f")
    local_hub.add_fault(kind="status", route="api.batch", status=503, times=2)
    api.batch_bucket_files("alice/f", add=[(b"survived", "x")])
    assert local_hub.counts()["routes"]["api.batch"] == 3
    assert [f.path for f in api.list_bucket_tree("alice/f")] == ["x"]


def test_a_429_with_ratelimit_headers(local_hub: LocalHub) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    api = local_hub.api("alice")
    api.create_bucket("alice/f")
    limit = {"resource": "api", "remaining": 0, "reset": 0, "limit": 1000, "window": 300}
    local_hub.add_fault(kind="status", route="api.tree", status=429, rate_limit=limit, times=1)
    assert list(api.list_bucket_tree("alice/f")) == []  # waited t+1 s and retried
    local_hub.add_fault(kind="status", route="api.bucket_info", status=429, times=None,
                        rate_limit={**limit, "reset": 37})
    with pytest.raises(HfHubHTTPError, match=r"reached your 'api' rate limit.\nRetry after 37 seconds "
                                             r"\(0/1000 requests remaining in current 300s window\)"):
        api.bucket_info("alice/f")


def test_a_quota_spent_answers_429_with_the_hub_s_headers(local_hub: LocalHub) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    api = local_hub.api("alice")
    api.create_bucket("alice/q")
    local_hub.settings(quota={"window_s": 300, "api": 3})
    local_hub.reset_quota()
    api.bucket_info("alice/q")
    api.bucket_info("alice/q")
    local_hub.api("bob").bucket_info("alice/q")  # bob's own quota
    api.bucket_info("alice/q")
    with pytest.raises(HfHubHTTPError, match=r"429 Too Many Requests: you have reached your 'api' rate limit") as info:
        api.bucket_info("alice/q")
    assert info.value.response.headers["RateLimit-Policy"] == '"fixed window";"api";q=3;w=300'
    assert info.value.response.headers["RateLimit"].startswith('"api";r=0;t=')


def test_dropped_bodies_are_absorbed_by_both_clients(local_hub: LocalHub, tmp_path: Path) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/d")
    data = _random(200_000, 4)
    api.batch_bucket_files("alice/d", add=[(data, "x")])
    local_hub.add_fault(kind="drop", route="api.tree", times=1)
    local_hub.add_fault(kind="drop", route="cas.xorb_bytes", times=1, drop_fraction=0.3)
    assert [f.path for f in api.list_bucket_tree("alice/d")] == ["x"]
    assert _download(api, "alice/d", ["x"], tmp_path) == {"x": data}
    assert [rule["hits"] for rule in local_hub.faults()] == [1, 1]
    routes = local_hub.counts()["routes"]
    assert routes["api.tree"] == 2 and routes["cas.xorb_bytes"] == 2


def test_a_failed_batch_entry_leaves_the_others_applied(local_hub: LocalHub) -> None:
    from huggingface_hub.errors import BucketBatchError

    api = local_hub.api("alice")
    api.create_bucket("alice/b")
    local_hub.add_fault(kind="batch_entry", route="api.batch", entry="bad", message="disk full", times=None)
    with pytest.raises(BucketBatchError) as info:
        api.batch_bucket_files("alice/b", add=[(b"1", "good"), (b"2", "bad/one")], delete=["bad/two"])
    assert info.value.failures == [{"path": "bad/one", "error": "disk full"}, {"path": "bad/two", "error": "disk full"}]
    assert info.value.response.status_code == 200
    assert [f.path for f in api.list_bucket_tree("alice/b")] == ["good"]
    with pytest.raises(BucketBatchError) as info:
        api.batch_bucket_files("alice/b", delete=["bad/three"])
    assert info.value.response.status_code == 422


def test_an_expired_xet_token_is_fetched_again_but_a_refused_one_fails(local_hub: LocalHub, tmp_path: Path) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/t")
    api.batch_bucket_files("alice/t", add=[(b"payload", "x")])
    local_hub.reset_counts()
    local_hub.add_fault(kind="expired_token", route="api.xet_read_token", times=1)
    assert _download(api, "alice/t", ["x"], tmp_path / "a") == {"x": b"payload"}
    assert local_hub.counts()["routes"]["api.xet_read_token"] == 2  # hf_xet saw the expiry and asked again
    local_hub.add_fault(kind="expired_token", route="cas.reconstruction_v2", times=1)
    with pytest.raises(RuntimeError, match=r"401 Unauthorized.*/v2/reconstructions/"):  # hf_xet does not retry a 401
        _download(api, "alice/t", ["x"], tmp_path / "b")
    local_hub.add_fault(kind="expired_token", route="cas.xorb_grant", times=1)
    with pytest.raises(ConnectionError, match=r"401 Unauthorized.*/v1/xorb-grants/"):
        api.batch_bucket_files("alice/t", add=[(b"new content", "y")])


def test_a_delay_slows_the_route_and_nothing_else(local_hub: LocalHub) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/s")
    local_hub.add_fault(kind="delay", route="api.bucket_info", delay_s=0.5, times=None)
    started = time.monotonic()
    api.bucket_info("alice/s")
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    list(api.list_bucket_tree("alice/s"))
    assert time.monotonic() - started < 0.5


def test_counts_by_class_and_no_unknown_routes(local_hub: LocalHub, tmp_path: Path) -> None:
    api = local_hub.api("alice")
    api.create_bucket("alice/c")
    api.batch_bucket_files("alice/c", add=[(_random(300_000, 5), "x")])
    _download(api, "alice/c", ["x"], tmp_path)
    counts = local_hub.counts()
    assert counts["unknown"] == []
    classes = counts["classes"]
    assert classes["api"] >= 5 and classes["resolver"] == 1 and classes["cas"] >= 6 and classes["unknown"] == 0
    expected = {"api.bucket_create", "api.xet_write_token", "cas.xorb_grant", "cas.grant_upload", "cas.xorb_commit",
                "cas.shard_upload_v2", "api.batch", "api.paths_info", "resolver.resolve", "api.xet_read_token",
                "cas.reconstruction_v2", "cas.xorb_bytes"}
    # a dedup query goes out for the chunks hf_xet deems eligible; telemetry is best effort, sent or not
    assert expected <= set(counts["routes"]) <= expected | {"cas.dedup_query", "cas.telemetry"}, counts["routes"]
    assert counts["users"]["alice"]["api"] == classes["api"]
    httpx.get(f"{local_hub.endpoint}/api/models/gpt2")
    (unknown,) = local_hub.counts()["unknown"]
    assert (unknown["method"], unknown["path"], unknown["status"]) == ("GET", "/api/models/gpt2", 404)
    local_hub.reset_counts()
    assert local_hub.counts()["classes"] == {"api": 0, "resolver": 0, "cas": 0, "unknown": 0}


def test_the_legacy_cas_routes_still_work(local_hub: LocalHub, tmp_path: Path) -> None:
    """With upload grants and the v2 routes answering 404, hf_xet falls back to `POST /v1/xorbs`, `/v1/shards` and
    `/v1/reconstructions` (its documented fallbacks)."""
    local_hub.settings(xorb_grants=False, cas_v2=False)
    api = local_hub.api("alice")
    api.create_bucket("alice/l")
    data = _random(150_000, 6) + _floats(20_000)
    api.batch_bucket_files("alice/l", add=[(data, "x")])
    assert _download(api, "alice/l", ["x"], tmp_path) == {"x": data}
    routes = local_hub.counts()["routes"]
    assert {"cas.xorb_upload", "cas.shard_upload_v1", "cas.reconstruction_v1"} <= set(routes), routes
    refused = {r["route"] for r in local_hub.requests() if r["status"] == 404}
    assert {"cas.xorb_grant", "cas.shard_upload_v2", "cas.reconstruction_v2"} <= refused


def test_a_restart_on_the_same_root_keeps_the_data(own_local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub = own_local_hub
    from huggingface_hub.errors import HfHubHTTPError

    api = local_hub.api("alice")
    api.create_bucket("alice/keep", private=True)
    data = _random(400_000, 7)
    api.batch_bucket_files("alice/keep", add=[(data, "x")])
    local_hub.revoke_token(local_hub.token("bob"))
    local_hub.restart(kill=True)
    assert [f.path for f in api.list_bucket_tree("alice/keep")] == ["x"]
    assert _download(api, "alice/keep", ["x"], tmp_path) == {"x": data}
    with pytest.raises(HfHubHTTPError, match="Invalid credentials"):
        local_hub.api("bob").bucket_info("alice/keep")


def test_delta_s_own_hf_backend_against_the_local_hub(local_hub: LocalHub) -> None:
    from delta.errors import FileTooLargeError
    from delta.storage import open_storage

    bucket = open_storage("hf://buckets/alice/run/v", token=local_hub.token("alice"), endpoint=local_hub.endpoint)
    data = _random(1 << 20, 8)
    bucket.write("weights/1.bin", data)
    bucket.write("manifest.json", b"{}")
    assert bucket.read("weights/1.bin") == data
    assert bucket.read("manifest.json", max_bytes=10) == b"{}"
    local_hub.reset_counts()
    with pytest.raises(FileTooLargeError):
        bucket.read("weights/1.bin", max_bytes=1000)
    assert local_hub.counts()["routes"] == {"api.paths_info": 1}  # the size asked, nothing downloaded
    listed = bucket.list()  # each with its Xet hash as the etag
    assert [(f.path, f.size) for f in listed] == [("manifest.json", 2), ("weights/1.bin", len(data))]
    held = local_hub.state()["buckets"]["alice/run"]["files"]
    assert [f.etag for f in listed] == [held["v/manifest.json"]["xet_hash"], held["v/weights/1.bin"]["xet_hash"]]
    bucket.move("weights/1.bin", "weights/2.bin")
    assert [f.path for f in bucket.list("weights/")] == ["weights/2.bin"]
    bucket.delete(["weights/2.bin", "never/there"])
    assert [(f.path, f.size) for f in bucket.list()] == [("manifest.json", 2)]
    with pytest.raises(FileNotFoundError):
        bucket.read("weights/2.bin")


# --- Space repositories (what `spaces/deploy.py` calls) ------------------------------------------


def test_space_repos_each_rule_as_huggingface_hub_raises_it(local_hub: LocalHub,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        BadRequestError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # After a 403, create_repo(exist_ok=True) builds its RepoUrl on huggingface_hub's own endpoint (not HfApi's):
    # point that at the local Hub, as HF_ENDPOINT would.
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", local_hub.endpoint)
    alice, read, bob = local_hub.api("alice"), local_hub.api("alice", "read"), local_hub.api("bob")
    anon = local_hub.api(None)
    bad = HfApi(endpoint=local_hub.endpoint, token="hf_not_a_token")
    space = {"repo_type": "space", "space_sdk": "docker"}
    alice.create_repo("alice/priv", private=True, **space)
    alice.create_repo("alice/pub", **space)
    creds = "Invalid credentials in Authorization header"
    table: list[tuple[str, Callable[[], Any], type[BaseException] | None, str]] = [
        ("exists", lambda: alice.create_repo("alice/pub", **space), HfHubHTTPError, "409 Conflict"),
        ("exists, exist_ok", lambda: alice.create_repo("alice/pub", exist_ok=True, **space), None, ""),
        ("read token creates", lambda: read.create_repo("alice/new", **space), HfHubHTTPError,
         "403 Forbidden: Your token is read-only"),
        # a 403, then repo_info finds it: passes
        ("read token, exist_ok", lambda: read.create_repo("alice/pub", exist_ok=True, **space), None, ""),
        ("read token, exist_ok, missing", lambda: read.create_repo("alice/new", exist_ok=True, **space),
         HfHubHTTPError, "403 Forbidden"),
        ("stranger creates", lambda: bob.create_repo("alice/new", **space), HfHubHTTPError, "don't have the rights"),
        ("stranger, org", lambda: bob.create_repo("team/new", **space), HfHubHTTPError, "403 Forbidden"),
        ("member, org", lambda: alice.create_repo("team/new", **space), None, ""),
        ("no token creates", lambda: anon.create_repo("alice/new", **space), HfHubHTTPError, "401"),
        ("bad token", lambda: bad.space_info("alice/pub"), HfHubHTTPError, creds),
        ("missing", lambda: alice.space_info("alice/nope"), RepositoryNotFoundError, "404 Client Error"),
        ("private, stranger", lambda: bob.space_info("alice/priv"), RepositoryNotFoundError, "404 Client Error"),
        ("private, no token", lambda: anon.space_info("alice/priv"), RepositoryNotFoundError, "401 Client Error"),
        ("private, stranger sets", lambda: bob.add_space_variable("alice/priv", "K", "v"), RepositoryNotFoundError,
         "404 Client Error"),
        ("public, no token", lambda: anon.space_info("alice/pub"), None, ""),
        ("public, stranger reads variables", lambda: bob.get_space_variables("alice/pub"), None, ""),
        ("public, stranger sets a variable", lambda: bob.add_space_variable("alice/pub", "K", "v"), HfHubHTTPError,
         "403 Forbidden"),
        ("public, stranger lists secrets", lambda: bob.get_space_secrets("alice/pub"), HfHubHTTPError, "403"),
        ("read token sets a secret", lambda: read.add_space_secret("alice/pub", "K", "v"), HfHubHTTPError,
         "403 Forbidden: Your token is read-only"),
        ("read token asks for hardware", lambda: read.request_space_hardware("alice/pub", "t4-small"),
         HfHubHTTPError, "403"),
        ("read token uploads", lambda: read.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="alice/pub",
                                                        repo_type="space"), HfHubHTTPError, "403"),
        ("unknown hardware", lambda: alice.request_space_hardware("alice/pub", "h100-giant"), BadRequestError,
         "unknown hardware flavor"),
        ("bad variable key", lambda: alice.add_space_variable("alice/pub", "1 X", "v"), BadRequestError,
         "invalid key"),
        ("missing revision", lambda: alice.space_info("alice/pub", revision="v2"), RevisionNotFoundError,
         "Revision Not Found"),
    ]
    wrong = []
    for name, call, expected, fragment in table:
        try:
            call()
            raised: BaseException | None = None
        except Exception as error:  # noqa: BLE001 - each row checks what it got
            raised = error
        if expected is None and raised is not None:
            wrong.append(f"{name}: raised {type(raised).__name__}: {raised}")
        elif expected is not None and (type(raised) is not expected or fragment not in str(raised)):
            wrong.append(f"{name}: expected {expected.__name__} with {fragment!r}, "
                         f"got {type(raised).__name__}: {raised}")
    assert not wrong, "\n".join(wrong)
    assert local_hub.counts()["unknown"] == []
    assert sorted(local_hub.state()["spaces"]) == ["alice/priv", "alice/pub", "team/new"]


def test_space_settings_and_files_through_the_real_client(own_local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub = own_local_hub
    from huggingface_hub.utils.sha import git_hash

    api = local_hub.api("alice")
    url = api.create_repo("alice/app", repo_type="space", space_sdk="gradio", private=True)
    assert (url.repo_id, url.repo_type) == ("alice/app", "space")
    api.add_space_variable("alice/app", "MODE", "fast", description="how fast")
    assert {k: (v.value, v.description) for k, v in api.add_space_variable("alice/app", "N", "3").items()} == {
        "MODE": ("fast", "how fast"), "N": ("3", None)}
    api.add_space_secret("alice/app", "TOKEN", "s3cret-value", description="the token")
    api.add_space_secret("alice/app", "TOKEN", "s3cret-value-2")  # an update
    secrets = api.get_space_secrets("alice/app")
    assert list(secrets) == ["TOKEN"] and secrets["TOKEN"].updated_at is not None
    listing = httpx.get(f"{local_hub.endpoint}/api/spaces/alice/app/secrets",
                        headers={"authorization": f"Bearer {local_hub.token('alice')}"})
    assert "s3cret" not in listing.text and local_hub.space("alice/app")["secrets"] == {"TOKEN": "s3cret-value-2"}
    runtime = api.request_space_hardware("alice/app", "t4-small", sleep_time=3600)
    assert (runtime.requested_hardware, runtime.sleep_time) == ("t4-small", 3600)
    assert api.get_space_runtime("alice/app").requested_hardware == "t4-small"

    folder = tmp_path / "app"
    files = {"README.md": b"---\ntitle: app\nsdk: gradio\napp_file: app.py\n---\n# app\n", "app.py": b"print(1)\n",
             "data/blob.bin": _random(200_000, 9), "data/empty": b"", "old/x.txt": b"x"}
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    api.upload_folder(repo_id="alice/app", repo_type="space", folder_path=str(folder), commit_message="first")
    info = api.space_info("alice/app", files_metadata=True)
    assert {s.rfilename: (s.size, s.blob_id) for s in info.siblings} == {
        p: (len(d), git_hash(d)) for p, d in files.items()}
    for path, data in files.items():  # binary and empty files too: every file went inline ("regular")
        assert local_hub.space_file("alice/app", path) == data
    api.upload_file(path_or_fileobj=b"print(2)\n", path_in_repo="app.py", repo_id="alice/app", repo_type="space")
    api.delete_file("data/empty", repo_id="alice/app", repo_type="space")
    api.delete_folder("old", repo_id="alice/app", repo_type="space")
    held = local_hub.space("alice/app")
    assert sorted(held["files"]) == ["README.md", "app.py", "data/blob.bin"]
    assert local_hub.space_file("alice/app", "app.py") == b"print(2)\n"
    assert [c["summary"] for c in held["commits"]][:2] == ["initial commit", "first"] and len(held["commits"]) == 5
    assert api.space_info("alice/app").sha == held["head"]

    (folder / "README.md").write_bytes(b"---\ntitle: [unclosed\n---\n")
    with pytest.raises(ValueError, match="Invalid metadata in README.md"):
        api.upload_folder(repo_id="alice/app", repo_type="space", folder_path=str(folder))
    lfs = b'{"key": "header", "value": {"summary": "s"}}\n{"key": "lfsFile", "value": {"path": "w", "oid": "0"}}\n'
    refused = httpx.post(f"{local_hub.endpoint}/api/spaces/alice/app/commit/main", content=lfs,
                         headers={"authorization": f"Bearer {local_hub.token('alice')}"})
    assert refused.status_code == 400 and "lfsFile" in refused.json()["error"]
    counts = local_hub.counts()
    assert counts["unknown"] == [] and counts["classes"]["api"] == sum(counts["routes"].values())
    local_hub.restart(kill=True)  # Spaces and their files are kept on the root like buckets
    assert local_hub.space("alice/app")["head"] == held["head"] and api.get_space_variables("alice/app")["N"].value == "3"
    assert local_hub.space_file("alice/app", "data/blob.bin") == files["data/blob.bin"]
