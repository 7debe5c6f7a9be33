"""Exam records in a real local bucket: written whole, read back checked, and a stranger's bad file refused
with its reason, never an error for the reader."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests._capped import HUGE, run_capped, sparse
from tests._published import publish_versions
from tests.test_wire_exam import record
from tests.test_wire_fleet import run_settings
from wire.exam import OTHER_KEY, ExamRecord
from fleet.exams import MAX_EXAM_BYTES, ExamShelf
from wire.fleet import encode, fleet_key


def exam(version: int) -> ExamRecord:
    return ExamRecord.model_validate(record(version=version))


def test_records_round_trip_by_version(tmp_path: Path) -> None:
    shelf = ExamShelf(str(tmp_path / "bucket"))
    assert shelf.records() == []
    publish_versions(str(tmp_path / "bucket"), 10)
    for v in (10, 0, 5):
        shelf.write(exam(v))
    assert [r.version for r in shelf.records()] == [0, 5, 10]
    assert ExamShelf(str(tmp_path / "bucket")).records() == shelf.records() and shelf.refused == {}
    shelf.write(exam(5).model_copy(update={"played_s": 99.5}))  # a second exam of v5: the newer file counts
    assert [r.played_s for r in shelf.records()] == [3.0, 99.5, 3.0]
    (tmp_path / "bucket" / "exams" / "v0000000010.json").unlink()
    assert [r.version for r in shelf.records()] == [0, 5]


def test_bad_files_are_refused_with_their_reason_and_the_rest_read(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    publish_versions(str(root), 12)
    shelf = ExamShelf(str(root))
    shelf.write(exam(5))
    exams = root / "exams"
    good = (exams / "v0000000005.json").read_bytes()
    (exams / "v0000000006.json").write_bytes(good[: len(good) // 2])  # torn
    envelope = json.loads(good)
    envelope["body"]["scores"]["letters"] = 4.9  # edited: the hash no longer matches
    (exams / "v0000000007.json").write_text(json.dumps(envelope))
    (exams / "v0000000008.json").write_bytes(good)  # copied under another version's name
    (exams / "v0000000009.json").write_bytes(encode(run_settings()))  # another kind of message
    crafted = exam(11).model_dump(mode="json")
    crafted["scores"]["own"] = 10**6  # a crafted record, hashed as it should be, out of range
    raw = json.dumps(crafted, sort_keys=True, separators=(",", ":")).encode()
    (exams / "v0000000011.json").write_text(json.dumps({"kind": "exam/1", "sha256": hashlib.sha256(raw).hexdigest(),
                                                        "body": crafted}))
    (exams / "v0000000012.json").write_bytes(b" " * (MAX_EXAM_BYTES + 1))
    (exams / "notes.txt").write_text("hello")
    assert [r.version for r in shelf.records()] == [5]
    reasons = {path.rsplit("/", 1)[-1]: why for path, why in shelf.refused.items()}
    assert "torn or corrupt" in reasons["v0000000006.json"]
    assert "does not match its sha256" in reasons["v0000000007.json"]
    assert "holds the exam of version 5" in reasons["v0000000008.json"]
    assert "expected 'exam/1'" in reasons["v0000000009.json"]
    assert "invalid scores" in reasons["v0000000011.json"]
    assert "more than the" in reasons["v0000000012.json"] and "not an exam file name" in reasons["notes.txt"]
    (exams / "v0000000006.json").write_bytes(encode(exam(6)))  # repaired: read again, refusal dropped
    assert [r.version for r in shelf.records()] == [5, 6] and not any("v0000000006" in p for p in shelf.refused)


def test_records_signed_with_another_token_are_counted_as_such_never_dropped_in_silence(tmp_path: Path) -> None:
    """An earlier start's records, signed with another rollout token: refused (their signature cannot be trusted),
    and counted apart from damaged files so the pages can say what happened and what to do."""
    bucket = str(tmp_path / "bucket")
    publish_versions(bucket, 10)  # records of published versions: refused here only for their signatures
    ExamShelf(bucket, fleet_key("last-start")).write(exam(0))
    ExamShelf(bucket, fleet_key("last-start")).write(exam(5))
    ExamShelf(bucket).write(exam(7))  # unsigned
    (tmp_path / "bucket" / "exams" / "v0000000008.json").write_text("{torn")
    shelf = ExamShelf(bucket, fleet_key("this-start"))
    shelf.write(exam(10))
    assert [r.version for r in shelf.records()] == [10]
    assert shelf.refusals() == {OTHER_KEY: 3, "torn or corrupt": 1}
    assert "signed with another rollout token" in shelf.refused["exams/v0000000000.json"]
    assert [r.version for r in ExamShelf(bucket, fleet_key("last-start")).records()] == [0, 5]  # its own key reads them
    (tmp_path / "bucket" / "exams" / "v0000000005.json").unlink()
    shelf.records()
    assert shelf.refusals() == {OTHER_KEY: 2, "torn or corrupt": 1}


def test_a_record_ahead_of_the_newest_published_version_is_refused_until_published(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    publish_versions(str(root), 3)
    shelf = ExamShelf(str(root))
    for v in (0, 3, 4, 9_999_999_999):
        shelf.write(exam(v))
    assert [r.version for r in shelf.records()] == [0, 3] and shelf.published == 3
    assert shelf.refusals() == {"version ahead of the trainer": 2}
    assert "ahead of the newest version published in the bucket (3)" in shelf.refused["exams/v0000000004.json"]
    publish_versions(str(root), 1)  # version 4 published (a publisher resumes from the bucket): its exam counts now
    assert [r.version for r in shelf.records()] == [0, 3, 4] and shelf.refusals() == {"version ahead of the trainer": 1}
    (root / "exams" / "v9999999999.json").unlink()  # gone: no longer counted
    assert shelf.records()[-1].version == 4 and shelf.refusals() == {} and shelf.refused == {}


def test_a_refused_file_that_is_deleted_drops_out_of_the_count(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    shelf = ExamShelf(str(root))
    shelf.write(exam(0))
    (root / "exams" / "v0000000001.json").write_text("{torn")
    assert [r.version for r in shelf.records()] == [0] and shelf.refusals() == {"torn or corrupt": 1}
    (root / "exams" / "v0000000001.json").unlink()
    assert [r.version for r in shelf.records()] == [0] and shelf.refusals() == {}


def test_a_2_gb_exam_file_is_refused_unread_and_one_that_grew_is_not_read_past_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    sparse(root / "exams" / "v0000000000.json", HUGE, b'{"kind"')
    setup = ("from fleet.exams import ExamShelf, MAX_EXAM_BYTES\nfrom wire.exam import ExamRecord\n"
             "from wire.fleet import FleetMessageError\nfrom fleet.bucket import read_message\n"
             "from delta.storage import StoredFile\n"
             f"shelf = ExamShelf({str(root)!r})")
    body = ("print('records', shelf.records(), shelf.refusals())\n"
            "try:\n    read_message(shelf.bucket, 'exams/v0000000000.json', ExamRecord, None, MAX_EXAM_BYTES,\n"
            "                 StoredFile('exams/v0000000000.json', 100))\n"
            "except FleetMessageError as e:\n    print('grew:', e.category, e.reason)")
    done = run_capped(setup, body)
    assert "records [] {'too large': 1}\n" in done.stdout, done.stdout
    assert "grew: too large 2147483648 bytes, more than the 262144 a message may hold here" in done.stdout
