"""The fleet's messages through a real bucket: committed whole, checked on read, refused when damaged."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._capped import HUGE, run_capped, sparse
from wire.fleet import (
    MAX_MESSAGE_BYTES, MAX_RUN_BYTES, FleetMessageError, GameGroup, Heartbeat, Refusal, RunSettings, RunState, Sampling,
    ServerState, decode, encode, group_path, group_run,
)
from fleet.bucket import FleetBucket
from wire.fleet_checks import check_group, max_group_bytes
from wire.trajectory import Trajectory, VersionSpan


def game(version: int = 3, tokens: int = 4) -> Trajectory:
    return Trajectory(prompt_ids=[1, 2, 3], episode_id="e1", completion_ids=list(range(tokens)),
                      logprobs=[-0.5] * tokens, env_mask=[1] * tokens, reward=0.25, versions=[version, version])


def group(run: str = "run-1", seq: int = 0, version: int = 3, games: int = 2) -> GameGroup:
    return GameGroup(run_id=run, server_id="srv-a", boot="b00t", seq=seq, seed=42,
                     games=[game(version) for _ in range(games)], played_s=1.5, created_at=time.time())


def run_settings(state: RunState = RunState.RUNNING) -> RunSettings:
    return RunSettings(run_id="run-1", state=state, num_generations=2, groups_per_step=2, max_staleness=1,
                       max_pending_groups=2, trainer_version=5, updated_at=time.time(), max_game_tokens=512,
                       sampling=Sampling(max_tokens=8, temperature=1.0, max_turns=3, reply_prefix="<guess>"))


def test_every_message_round_trips_through_a_local_bucket(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "bucket"))
    assert bucket.read_run() is None
    bucket.write_run(run_settings())
    assert bucket.read_run() == run_settings().model_copy(update={"updated_at": bucket.read_run().updated_at})
    g = group()
    path = bucket.write_group(g)
    assert path == "fleet/groups/run-1.srv-a.b00t.00000000.json" and group_run(path) == "run-1"
    assert [f.path for f in bucket.list_groups()] == [path]
    assert bucket.read_group(path) == g and bucket.read_group(path).version == 3
    beat = Heartbeat(server_id="srv-a", boot="b00t", beat=1, state=ServerState.FULL, version=3, games_per_min=2.0,
                     groups_written=1, idle_share=0.5, updated_at=time.time())
    bucket.write_heartbeat(beat)
    [f] = bucket.list_heartbeats()
    assert bucket.read_heartbeat(f.path) == beat


@settings(max_examples=30, deadline=None)
@given(seq=st.integers(0, 10**7), version=st.integers(0, 10**6), reward=st.floats(-5, 5), text=st.text(max_size=20))
def test_a_group_decodes_to_exactly_what_was_encoded(seq: int, version: int, reward: float, text: str) -> None:
    g = group(seq=seq, version=version)
    g = g.model_copy(update={"games": [g.games[0].model_copy(update={"reward": reward, "replies": [text]})] * 2})
    assert decode(encode(g), GameGroup) == g


def test_the_same_message_is_the_same_bytes() -> None:
    g = group()
    assert encode(g) == encode(GameGroup.model_validate(json.loads(json.dumps(g.model_dump(mode="json")))))


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[: len(b) // 2], "not whole JSON"),
    (lambda b: b.replace(b'"reward":0.25', b'"reward":9.25', 1), "does not match its sha256"),
    (lambda b: b"[]", "not a fleet message"),
    (lambda b: b.replace(b'"fleet-group/1"', b'"fleet-run/1"'), "kind 'fleet-run/1', expected 'fleet-group/1'"),
    (lambda b: b"\xff\xfe" + b, "not whole JSON"),
    (lambda b: b"[" * 100_000 + b"]" * 100_000, "not"),
])
def test_a_damaged_group_is_refused_with_what_is_wrong(damage, reason) -> None:
    with pytest.raises(FleetMessageError, match=reason):
        decode(damage(encode(group())), GameGroup, "g.json")


def _resealed(body: dict) -> bytes:
    """A crafted message whose hash matches its body: only the field checks can refuse it."""
    import hashlib

    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"kind": "fleet-group/1", "sha256": hashlib.sha256(raw).hexdigest(), "body": body}).encode()


@pytest.mark.parametrize("edit, reason", [
    (lambda b: b["games"][0].update(logprobs=[0.0]), "invalid body: .*game 0: 4 completion tokens but 1 logprobs"),
    (lambda b: b["games"][0].update(versions=[]), "invalid body: .*game 0: no weight version"),
    (lambda b: b["games"][0].update(env_mask=[1, 1, 1, 7]), "invalid body: .*game 0: env_mask holds"),
    (lambda b: b.update(run_id="../../etc"), "invalid run_id: String should match pattern"),
    (lambda b: b.update(extra="x"), "invalid extra: Extra inputs are not permitted"),
    (lambda b: b.update(games=[]), "invalid games: List should have at least 1 item"),
])
def test_a_crafted_group_with_a_valid_hash_is_refused_by_its_fields(edit, reason) -> None:
    body = group().model_dump(mode="json")
    edit(body)
    with pytest.raises(FleetMessageError, match=reason):
        decode(_resealed(body), GameGroup, "g.json")


def test_a_file_renamed_by_hand_is_refused(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "bucket"))
    data = encode(group(seq=1))
    bucket.bucket.write(group_path("run-1", "srv-a", "b00t", 2), data)
    with pytest.raises(FleetMessageError, match="renamed or copied"):
        bucket.read_group(group_path("run-1", "srv-a", "b00t", 2))


def test_an_oversized_message_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(FleetMessageError, match="more than"):
        decode(b" " * (MAX_MESSAGE_BYTES + 1), GameGroup)


# -- strict numbers, bounds and signatures (issue 37: every file in the bucket as hard to forge as a delta) --------


def _resealed_raw(body_text: str, kind: str = "fleet-group/1") -> bytes:
    """A crafted message whose body is `body_text` as written (strings where numbers belong...), its hash matching
    the body as a reader re-serialises it."""
    import hashlib

    body = json.loads(body_text)
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"kind": kind, "sha256": hashlib.sha256(raw).hexdigest(), "body": body}).encode()


@pytest.mark.parametrize("edit, reason", [
    (lambda b: b["games"][0].update(logprobs=["NaN"] * 4), r"invalid games\.0\.logprobs\.0: Input should be a valid "
                                                           "number"),
    (lambda b: b["games"][0].update(reward="Infinity"), r"invalid games\.0\.reward: Input should be a valid number"),
    (lambda b: b["games"][0].update(logprobs=[50.0] * 4), r"logprobs\.0: Input should be less than or equal to 0"),
    (lambda b: b["games"][0].update(logprobs=[-1e308] * 3 + [1e308]), r"logprobs\.3: Input should be less than"),
    (lambda b: b["games"][0].update(reward=1e308), r"games\.0\.reward: Input should be less than or equal to 1000"),
    (lambda b: b["games"][0].update(turn_rewards=[-5000.0]), r"turn_rewards\.0: Input should be greater than"),
    (lambda b: b["games"][0].update(prompt_ids=[1, -5, 3]), r"prompt_ids\.1: Input should be greater than or equal"),
    (lambda b: b["games"][0].update(completion_ids=[0, 1, 2, 10**30]), r"completion_ids\.3: Input should be less"),
    (lambda b: b.update(seq="123"), r"invalid seq: Input should be a valid integer"),
    (lambda b: b.update(seq=True), r"invalid seq: Input should be a valid integer"),
    (lambda b: b.update(seq=1.0), r"invalid seq: Input should be a valid integer"),
    (lambda b: b["games"][0].update(versions=[10**20]), r"versions\.0: Input should be less than or equal"),
    (lambda b: b["games"][0].update(won=1), r"games\.0\.won: Input should be a valid boolean"),
])
def test_numbers_are_strict_and_bounded_whatever_the_hash_says(edit, reason) -> None:
    body = group().model_dump(mode="json")
    edit(body)
    with pytest.raises(FleetMessageError, match=reason) as e:
        decode(_resealed(body), GameGroup, "g.json")
    assert e.value.category == Refusal.INVALID


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_that_are_not_numbers_are_refused(constant) -> None:
    text = json.dumps(group().model_dump(mode="json")).replace('"reward": 0.25', f'"reward": {constant}', 1)
    with pytest.raises(FleetMessageError, match="body cannot be hashed"):
        decode(_resealed_raw(text), GameGroup, "g.json")


def test_a_stranger_s_run_settings_are_bounded() -> None:
    body = run_settings().model_dump(mode="json")
    for field, value in [("max_pending_groups", 10**6), ("max_staleness", 10**9), ("max_game_tokens", 10**7),
                         ("vocab_size", 0), ("trainer_version", -1)]:
        with pytest.raises(FleetMessageError, match=f"invalid {field}: Input should be"):
            decode(_resealed_raw(json.dumps({**body, field: value}), "fleet-run/1"), RunSettings)


def test_signed_files_round_trip_and_every_forgery_is_refused(tmp_path: Path) -> None:
    signed = FleetBucket(str(tmp_path / "bucket"), secret="the-rollout-token")
    stranger = FleetBucket(signed.bucket)  # write access to the bucket, no token
    g = group()
    signed.write_group(g)
    assert signed.read_group(g.path) == g and stranger.read_group(g.path) == g  # a reader without the key reads it
    data = signed.bucket.read(g.path)
    assert json.loads(data)["hmac"] and "the-rollout-token" not in data.decode()

    def refused(path: str, match: str) -> None:
        with pytest.raises(FleetMessageError, match=match) as e:
            signed.read_group(path)
        assert e.value.category in (Refusal.UNSIGNED, Refusal.RENAMED)

    stranger.write_group(group(seq=1))
    refused(group(seq=1).path, "unsigned, and this run signs its files")
    # replayed under a new sequence number: the body edited to match its new name, resealed without the key
    body = json.loads(data)
    body["body"]["seq"] = 2
    raw = json.dumps(body["body"], sort_keys=True, separators=(",", ":")).encode()
    body["sha256"] = __import__("hashlib").sha256(raw).hexdigest()
    signed.bucket.write(group(seq=2).path, json.dumps(body).encode())
    refused(group(seq=2).path, "the signature does not match")
    # the same file copied as it is under another name
    signed.bucket.write(group(seq=3).path, data)
    refused(group(seq=3).path, "renamed or copied")
    # signed with another token
    FleetBucket(signed.bucket, secret="another-token").write_group(group(seq=4))
    refused(group(seq=4).path, "the signature does not match")


def test_a_heartbeat_under_another_server_s_name_is_refused(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "bucket"), secret="t")
    beat = Heartbeat(server_id="srv-a", boot="b00t", beat=1, state=ServerState.PRODUCING, version=3,
                     games_per_min=2.0, groups_written=1, idle_share=0.5, updated_at=time.time())
    bucket.bucket.write("fleet/servers/srv-b.json", encode(beat, bucket.key))
    with pytest.raises(FleetMessageError, match="holds the heartbeat of server srv-a") as e:
        bucket.read_heartbeat("fleet/servers/srv-b.json")
    assert e.value.category == Refusal.RENAMED
    FleetBucket(bucket.bucket).write_heartbeat(beat)  # unsigned
    with pytest.raises(FleetMessageError, match="unsigned"):
        bucket.read_heartbeat("fleet/servers/srv-a.json")


def _run(**update) -> RunSettings:
    return run_settings().model_copy(update={"vocab_size": 100, **update})


@pytest.mark.parametrize("games, run, newest, category, match", [
    (lambda g: g.model_copy(update={"completion_ids": [0, 1, 2, 100]}), {}, 5, Refusal.VOCABULARY,
     "token id 100, the run's vocabulary holds 100"),
    (lambda g: g.model_copy(update={"prompt_ids": [99] * 600}), {}, 5, Refusal.SHAPE,
     "604 tokens, more than the run's 512"),
    (lambda g: g.model_copy(update={"versions": [3] * 4}), {}, 5, Refusal.SHAPE, "4 replies, the run plays at most 3"),
    (lambda g: g.model_copy(update={"completion_ids": list(range(9)), "logprobs": [-1.0] * 9, "env_mask": [1] * 9}),
     {}, 5, Refusal.SHAPE, r"a reply holds at most 8"),
    (lambda g: g, {}, 2, Refusal.AHEAD, "a reply of weight version 3, newer than the trainer's 2"),
    (lambda g: g.model_copy(update={"versions": [3, 10**12]}), {}, 5, Refusal.AHEAD, "version 1000000000000"),
    (lambda g: g.model_copy(update={"spans": [VersionSpan(version=4, start=0, end=1)]}), {}, 3, Refusal.AHEAD,
     "a reply of weight version 4, newer than the trainer's 3"),  # a token's version, as vLLM reported it
    (lambda g: g, {"num_generations": 4}, 5, Refusal.SHAPE, "2 games, the run's groups hold 4"),
    (lambda g: g, {"run_id": "run-2"}, 5, Refusal.ANOTHER_RUN, "of run run-1, not run-2"),
])
def test_a_group_is_checked_against_its_run(games, run, newest, category, match) -> None:
    g = group()
    g = g.model_copy(update={"games": [games(x) for x in g.games]})
    with pytest.raises(FleetMessageError, match=match) as e:
        check_group(g, _run(**run), newest, g.path)
    assert e.value.category == category
    check_group(group(), _run(), 3, "ok.json")  # the same group as written passes


def test_a_group_file_is_bounded_by_its_run_s_settings() -> None:
    run = _run()
    limit = max_group_bytes(run)
    assert len(encode(group())) < limit < 2 * 2 * (64 << 10 + 256 * run.max_game_tokens)
    with pytest.raises(FleetMessageError, match="more than the") as e:
        decode(encode(group()), GameGroup, "g.json", max_bytes=100)
    assert e.value.category == Refusal.TOO_LARGE


def test_2_gb_fleet_files_are_refused_without_being_read_and_the_readers_keep_answering(tmp_path: Path) -> None:
    """run.json, a heartbeat and a group swapped for 2 GB files, read under a memory cap that reading one whole
    breaks: each is refused as too large, and the heartbeat watch still reads the good heartbeat beside it."""
    root = tmp_path / "bucket"
    good = Heartbeat(server_id="srv-a", boot="b00t", beat=1, state=ServerState.PRODUCING, version=3,
                     games_per_min=2.0, groups_written=1, idle_share=0.5, updated_at=time.time())
    FleetBucket(str(root)).write_heartbeat(good)
    for path in ("fleet/run.json", "fleet/servers/srv-b.json", group().path):
        sparse(root / path, HUGE, b'{"kind": "fleet-run/1", "body": {')
    setup = ("from fleet.bucket import FleetBucket\nfrom wire.fleet import FleetMessageError\n"
             "from fleet.liveness import HeartbeatWatch\n"
             f"bucket = FleetBucket({str(root)!r})\nwatch = HeartbeatWatch(bucket)\n"
             "def refused(call):\n    try:\n        call()\n    except FleetMessageError as e:\n"
             "        return f'{e.category}: {e.reason}'\n")
    body = ("for _ in range(3):  # every poll: no read costs more than the bound\n"
            "    print('run', refused(bucket.read_run))\n"
            "    print('beats', [s.heartbeat.server_id for s in watch.read()], dict(watch.refused))\n"
            f"print('group', refused(lambda: bucket.read_group({group().path!r})))")
    done = run_capped(setup, body)
    lines = done.stdout.splitlines()
    assert lines[0] == f"run too large: 2147483648 bytes, more than the {MAX_RUN_BYTES} a message may hold here"
    assert lines.count(lines[0]) == 3 and lines.count("beats ['srv-a'] {'too large': 1}") == 3, lines
    assert lines[-1] == "group too large: 2147483648 bytes, more than the 67108864 a message may hold here", lines


def test_a_run_file_listed_as_too_large_is_refused_unread_until_its_size_changes(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    bucket = FleetBucket(str(root))
    sparse(root / "fleet/run.json", MAX_RUN_BYTES + 1, b'{"kind": "fleet-run/1"')
    reads = []
    read = bucket.bucket.read
    bucket.bucket.read = lambda path, **kw: reads.append(path) or read(path, **kw)
    for _ in range(3):
        with pytest.raises(FleetMessageError, match="more than the") as e:
            bucket.read_run()
        assert e.value.category == Refusal.TOO_LARGE
    assert reads == []  # refused by its listing alone, never read
    bucket.write_run(run_settings())
    assert bucket.read_run().run_id == "run-1" and len(reads) == 1
    (root / "fleet/run.json").unlink()
    assert bucket.read_run() is None


def test_the_run_settings_are_read_only_when_the_trainers_key_signed_them(tmp_path: Path, caplog) -> None:
    """Every server holds the rollout token, so the run's settings are also signed with the trainer's own key: a
    stranger's settings (its own key, none, or the trainer's signature over an edited body) are refused in one line,
    counted once each, and the last settings the trainer signed are read instead, until it writes new ones."""
    import hashlib

    from delta import SigningKey, Trust

    key = SigningKey.generate()
    trainer = FleetBucket(str(tmp_path / "bucket"), secret="tok", signing_key=key)
    server = FleetBucket(trainer.bucket.storage, secret="tok", trust=Trust(trainer.url, key.public))
    reader = FleetBucket(trainer.bucket.storage, trust=Trust(trainer.url, key.public))  # no token: the signature alone
    first = run_settings()
    trainer.write_run(first)
    assert server.read_run() == first and reader.read_run() == first
    envelope = json.loads(trainer.bucket.storage.read("fleet/run.json"))
    assert envelope["signer"] == key.public.text and set(envelope) == {"kind", "sha256", "body", "hmac", "signer",
                                                                        "signature"}
    FleetBucket(trainer.bucket.storage, secret="tok", signing_key=SigningKey.generate()).write_run(run_settings(RunState.STOPPED))
    assert server.read_run() == first and server.read_run() == first  # read twice, counted once
    assert server.runs_refused == 1 and server.run_refusal.startswith("fleet/run.json: this file is signed by SHA256:")
    trainer.bucket.storage.write("fleet/run.json", encode(run_settings(RunState.STOPPED), server.key))  # HMAC, no signature
    assert server.read_run() == first and server.runs_refused == 2 and "this file is unsigned" in server.run_refusal
    edited = dict(envelope, body={**envelope["body"], "state": "stopped"})  # the trainer's signature over another body
    del edited["hmac"]
    edited["sha256"] = hashlib.sha256(json.dumps(edited["body"], sort_keys=True, separators=(",", ":")).encode()
                                      ).hexdigest()
    trainer.bucket.storage.write("fleet/run.json", json.dumps(edited).encode())
    assert reader.read_run() == first and reader.runs_refused == 1
    assert reader.run_refusal == ("fleet/run.json: this file: the signature does not match what it signs (forged or "
                                  "edited)")
    assert caplog.text.count("REFUSED the run's settings") == 3
    later = run_settings(RunState.PAUSED)
    trainer.write_run(later)
    assert server.read_run() == later and reader.read_run() == later  # the trainer's next settings
    fresh = FleetBucket(trainer.bucket.storage, trust=Trust(trainer.url, SigningKey.generate().public))
    with pytest.raises(FleetMessageError, match="not by the trusted") as refused:  # nothing it trusts read yet
        fresh.read_run()
    assert refused.value.category == Refusal.UNTRUSTED and "\n" not in str(refused.value)


def test_run_settings_signed_by_a_new_key_carry_its_handover_and_a_reader_of_the_old_key_follows(
        tmp_path: Path) -> None:
    """A trainer whose key replaced another writes the handovers to its key beside its signature: a server that trusts
    the old key reads the new key's settings at once (and trusts the new key from then on); without the handover, or
    with one the old key did not sign, they are refused; handovers that are not handovers are refused in one line."""
    from delta import SigningKey, Trust
    from delta.signing import make_handover

    old, new, stranger = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    storage = FleetBucket(str(tmp_path / "bucket")).bucket.storage
    server = FleetBucket(storage, trust=Trust(storage.url, old.public))
    FleetBucket(storage, signing_key=new).write_run(run_settings())  # no handover: another key
    with pytest.raises(FleetMessageError, match="no handover signed by the trusted key introduces it"):
        server.read_run()
    forged = make_handover(stranger, new.public)  # a handover, but not from the key the server trusts
    FleetBucket(storage, signing_key=new, handovers=[forged]).write_run(run_settings(RunState.PAUSED))
    with pytest.raises(FleetMessageError, match="not by the trusted"):
        server.read_run()
    assert server.trust.key == old.public
    handover = make_handover(old, new.public)
    FleetBucket(storage, signing_key=new, handovers=[forged, handover]).write_run(run_settings(RunState.STOPPED))
    envelope = json.loads(storage.read("fleet/run.json"))
    assert [h["old"] for h in envelope["handovers"]] == [stranger.public.text, old.public.text]
    assert server.read_run().state == RunState.STOPPED and server.trust.key == new.public
    assert "handed over from" in server.trust.describe()
    data = storage.read("fleet/run.json")
    for handovers, reason in (("x", "invalid handovers: a list of at most 16"), ([{}] * 17, "a list of at most 16"),
                              ([{"old": "x", "new": "y", "signature": "z"}], "invalid handovers: old must be")):
        bad = json.dumps({**json.loads(data), "handovers": handovers}).encode()
        with pytest.raises(FleetMessageError, match=reason) as refused:
            decode(bad, RunSettings, trust=Trust(storage.url, old.public))
        assert refused.value.category == Refusal.INVALID


def _beat(**fields) -> Heartbeat:
    return Heartbeat(server_id="srv-a", boot="b00t", beat=1, state=ServerState.PRODUCING, version=3,
                     games_per_min=2.0, groups_written=1, idle_share=0.5, updated_at=1.0, **fields)


def test_a_heartbeat_says_whether_the_server_checks_the_weights_and_an_older_servers_is_still_read() -> None:
    """`fleet-heartbeat/2` carries whether the server checks the trainer's signature and with which key; a reader of
    it reads an older server's `fleet-heartbeat/1` (its trust unknown), never a /1 that claims the new fields, and
    refuses a later version in one line."""
    key = "SHA256:" + "Ab+/" * 10 + "xyz"
    for beat in (_beat(authenticated=True, trusted_key=key), _beat(authenticated=False), _beat()):
        data = encode(beat, b"k")
        assert json.loads(data)["kind"] == "fleet-heartbeat/2" and decode(data, Heartbeat, key=b"k") == beat
    old = dict(_beat().model_dump(mode="json"))
    del old["authenticated"], old["trusted_key"]
    raw = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    envelope = {"kind": "fleet-heartbeat/1", "sha256": hashlib.sha256(raw).hexdigest(), "body": old,
                "hmac": hmac.new(b"k", b"fleet-heartbeat/1\n" + raw, hashlib.sha256).hexdigest()}
    read = decode(json.dumps(envelope).encode(), Heartbeat, key=b"k")  # the HMAC of the kind it was written as
    assert read == _beat() and read.authenticated is None and read.trusted_key is None
    claims = {**old, "authenticated": True}
    raw = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(FleetMessageError, match="invalid body: authenticated is not a field of fleet-heartbeat/1"):
        decode(json.dumps({**envelope, "body": claims, "sha256": hashlib.sha256(raw).hexdigest()}).encode(), Heartbeat)
    with pytest.raises(FleetMessageError, match="invalid trusted_key"):
        decode(encode(_beat(authenticated=True).model_copy(update={"trusted_key": "SHA256:short"})), Heartbeat)
    later = encode(_beat(authenticated=True)).replace(b'"fleet-heartbeat/2"', b'"fleet-heartbeat/3"')
    with pytest.raises(FleetMessageError, match="kind 'fleet-heartbeat/3', expected 'fleet-heartbeat/2'"):
        decode(later, Heartbeat)
