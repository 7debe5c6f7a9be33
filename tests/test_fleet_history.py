"""The trainer's history kept in a real bucket folder: written after changes, read back by the next trainer, an
unreadable file set aside (never overwritten unread), a bucket that cannot be read never written."""

from __future__ import annotations

from pathlib import Path

import delta
from tests._capped import HUGE, run_capped, sparse
from tests._trainer_stack import wait_until
from tests.test_wire_history import HISTORY, step
from fleet.history import HistoryKeeper
from wire.history import HISTORY_PATH, MAX_HISTORY_BYTES, decode_history
from wire.trainer import TrainerHistory


def read_back(bucket: Path) -> TrainerHistory:
    return decode_history((bucket / HISTORY_PATH).read_bytes()).history


def test_changes_are_written_folded_and_read_back_by_the_next_trainer(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    keeper = HistoryKeeper(str(bucket), interval_s=0.2)
    assert keeper.load() == TrainerHistory(steps=[], payloads=[]) and keeper.problem is None  # nothing yet
    held = TrainerHistory(steps=list(HISTORY.steps[:2]), payloads=[])
    keeper.start(lambda: held)
    keeper.changed()
    wait_until(lambda: keeper.writes == 1, 10, "the first write")
    held = HISTORY
    for _ in range(20):  # a burst of changes: folded into a write or two, not twenty
        keeper.changed()
    assert keeper.close(10)
    assert keeper.writes <= 4 and read_back(bucket) == HISTORY
    later = HistoryKeeper(str(bucket))
    assert later.load() == HISTORY  # a restarted trainer reads what the last one wrote


def test_an_unreadable_history_is_set_aside_and_a_new_one_begins(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    (bucket / "trainer").mkdir(parents=True)
    (bucket / HISTORY_PATH).write_bytes(b'{"format": "trainer-history", "format_ver')  # torn by hand
    keeper = HistoryKeeper(str(bucket), interval_s=0.1)
    assert keeper.load() == TrainerHistory(steps=[], payloads=[]) and keeper.problem is None
    [aside] = [p for p in (bucket / "trainer").iterdir() if p.name != "history.json"]
    assert aside.name.startswith("history.unreadable-") and aside.read_bytes().endswith(b'"format_ver')
    keeper.start(lambda: TrainerHistory(steps=[step(1)], payloads=[]))
    keeper.changed()
    assert keeper.close(10) and [s.step for s in read_back(bucket).steps] == [1]


def test_bad_records_are_dropped_and_the_rest_kept(tmp_path: Path, caplog) -> None:
    bucket = tmp_path / "bucket"
    storage = delta.Bucket.open(str(bucket))
    keeper = HistoryKeeper(str(bucket))
    keeper.load()
    keeper.start(lambda: HISTORY)
    keeper.changed()
    assert keeper.close(10)
    text = storage.read(HISTORY_PATH).replace(b'"step":2,', b'"step":-2,', 1)
    storage.write(HISTORY_PATH, text)
    loaded = HistoryKeeper(str(bucket)).load()
    assert [s.step for s in loaded.steps] == [1, 3, 4]
    assert "1 record(s) refused (steps[1]: step is negative)" in caplog.text


def test_a_history_that_cannot_be_read_is_never_replaced(own_rclone_s3) -> None:
    rclone_s3 = own_rclone_s3
    options = dict(rclone_s3.storage_options(), retry=delta.storage.RetryPolicy(attempts=2, first_delay=0.1, max_delay=0.2))
    storage = delta.Bucket.open("s3://bucket/run", **options)
    first = HistoryKeeper(storage)
    first.load()
    first.start(lambda: HISTORY)
    first.changed()
    assert first.close(30)
    rclone_s3.stop()  # the bucket is unreachable when the next trainer starts
    keeper = HistoryKeeper(storage, interval_s=0.05)
    assert keeper.load() == TrainerHistory(steps=[], payloads=[])
    assert keeper.problem is not None and "could not be read, so it is not written either" in keeper.problem
    keeper.start(lambda: TrainerHistory(steps=[step(1)], payloads=[]))
    keeper.changed()
    assert not keeper.close(1) and keeper.writes == 0
    rclone_s3.start()
    assert decode_history(storage.read(HISTORY_PATH)).history == HISTORY  # the earlier trainer's, whole


def test_a_2_gb_history_is_moved_aside_unread_and_a_fresh_one_begins(tmp_path: Path) -> None:
    """Under a memory cap that reading it whole breaks, `load` does not raise: the file is moved aside uncopied and a
    fresh history begins."""
    root = tmp_path / "bucket"
    sparse(root / HISTORY_PATH, HUGE, b'{"format": "trainer-history"')
    setup = ("from fleet.history import HistoryKeeper\nfrom wire.trainer import TrainerHistory\n"
             f"keeper = HistoryKeeper({str(root)!r}, interval_s=0.05)")
    body = ("print('loaded', keeper.load() == TrainerHistory(steps=[], payloads=[]), keeper.problem)\n"
            "keeper.start(lambda: TrainerHistory(steps=[], payloads=[]))\nkeeper.changed()\n"
            "print('wrote', keeper.close(30))")
    done = run_capped(setup, body)
    assert done.stdout == "loaded True None\nwrote True\n", done.stdout + done.stderr[-2000:]
    assert "2147483648 bytes, more than the 33554432 a history may hold, set aside as trainer/history.unreadable-" \
        in done.stderr
    [aside] = [p for p in (root / "trainer").iterdir() if p.name != "history.json"]
    assert aside.stat().st_size == HUGE and aside.stat().st_blocks * 512 < 1 << 20  # moved, never copied
    assert decode_history((root / HISTORY_PATH).read_bytes()).history == TrainerHistory(steps=[], payloads=[])


def test_a_history_over_its_bound_on_s3_is_moved_aside_by_the_server(rclone_s3) -> None:
    storage = delta.Bucket.open(f"s3://{rclone_s3.bucket}/run", **rclone_s3.storage_options())
    storage.write(HISTORY_PATH, b" " * (MAX_HISTORY_BYTES + 1))
    keeper = HistoryKeeper(storage, interval_s=0.05)
    assert keeper.load() == TrainerHistory(steps=[], payloads=[]) and keeper.problem is None
    [aside] = [f for f in storage.list("trainer/") if f.path != HISTORY_PATH]
    assert aside.path.startswith("trainer/history.unreadable-") and aside.size == MAX_HISTORY_BYTES + 1
    keeper.start(lambda: HISTORY)
    keeper.changed()
    assert keeper.close(30) and decode_history(storage.read(HISTORY_PATH)).history == HISTORY


def test_the_trainer_starts_and_answers_with_a_2_gb_file_in_every_place(tmp_path: Path) -> None:
    """history, run settings, a heartbeat, an exam record and the newest manifest, each a 2 GB file, under a memory
    cap that reading any one whole breaks: the session starts, reads the bucket, and its status counts the refusals."""
    from tests._published import publish_versions

    bucket = tmp_path / "bucket"
    publish_versions(str(bucket), 2)
    for path in (HISTORY_PATH, "fleet/run.json", "fleet/servers/srv-a.json", "exams/v0000000001.json",
                 "manifests/9999999999.json"):
        sparse(bucket / path, HUGE, b"{")
    setup = ("import time\nfrom trainer_space import TrainerConfig, build_session\n"
             f"config = TrainerConfig({str(bucket)!r}, None, {str(tmp_path / 'model')!r})")
    body = ("session = build_session(config)\nsession.exams.refresh()\n"
            "deadline = time.monotonic() + 30\n"
            "while not session.status().heartbeats_refused and time.monotonic() < deadline:\n    time.sleep(0.1)\n"
            "status = session.status()\n"
            "print('history', session.keeper.problem, len(session.history().steps))\n"
            "print('refused', status.heartbeats_refused, status.exams_refused, session.exams.shelf.published)\n"
            "session.close()")
    done = run_capped(setup, body)
    assert "history None 0\nrefused {'too large': 1} {'too large': 1} 2\n" in done.stdout, \
        done.stdout + done.stderr[-3000:]
