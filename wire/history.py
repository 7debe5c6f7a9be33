"""The trainer's history as a file in the bucket, so that a restarted trainer (a Space restarts, a person
stops and starts ``python app.py``) shows the curves of the versions before it and goes on counting steps.

One file, `HISTORY_PATH`, committed whole by one `Storage.write` (a local folder writes a temporary file and
renames it; S3 and Hugging Face buckets replace an object whole)::

    {"format": "trainer-history", "format_version": 1,
     "history": {"steps": [StepRecord...], "payloads": [Payload...], "anchors": [Anchor...]}}

`history` is `wire.trainer.TrainerHistory`, what ``GET /history`` answers: each of its fields is a list of one
kind of typed record, oldest first, so a new kind (an exam's results, say) is one more field, which files
written before it simply lack. The file may have been written by anyone: `decode_history` checks its size,
strict JSON and its format, then each record alone (its fields, finite numbers, counts not negative, steps
and versions in order), keeping the good ones and counting the rest, so one bad record loses one record.
Pydantic only: light to import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from webguard.strict_json import loads_strict

from .trainer import TrainerHistory

HISTORY_PATH = "trainer/history.json"
FORMAT = "trainer-history"
FORMAT_VERSION = 1
#: Largest history file read: 10,000 steps of ~700 bytes and as many payloads of ~200 bytes are ~9 MB.
MAX_HISTORY_BYTES = 32 << 20


#: The lists of records a history holds (its other fields, such as `exams_refused`, are this process's counts).
_RECORDS = tuple(name for name, info in TrainerHistory.model_fields.items() if get_origin(info.annotation) is list)


class HistoryFileError(ValueError):
    """A history file that cannot be read as one (torn, corrupt, too big, another format)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class DecodedHistory:
    """What a history file held: the records that passed every check, and a count of those that did not."""

    history: TrainerHistory
    skipped: dict[str, int] = field(default_factory=dict)  # field name -> records refused
    first_problem: str | None = None


def encode_history(history: TrainerHistory) -> bytes:
    """The file form of `history` (compact JSON)."""
    body = history.model_dump(mode="json", exclude={"exams_refused"})  # this process's counts, not history
    envelope = {"format": FORMAT, "format_version": FORMAT_VERSION, "history": body}
    return TypeAdapter(dict[str, Any]).dump_json(envelope)


def decode_history(data: bytes, path: str = HISTORY_PATH) -> DecodedHistory:
    """The records of a history file, each checked (see the module docstring).

    Raises:
        HistoryFileError: the file as a whole is not a history (too big, not strict JSON, another format).
    """
    if len(data) > MAX_HISTORY_BYTES:
        raise HistoryFileError(path, f"{len(data)} bytes, more than the {MAX_HISTORY_BYTES} a history may hold")
    try:
        envelope = loads_strict(data)
    except (ValueError, RecursionError) as e:
        raise HistoryFileError(path, f"not whole JSON (torn or corrupt): {str(e)[:200]}") from None
    if (
        not isinstance(envelope, dict)
        or envelope.get("format") != FORMAT
        or not isinstance(envelope.get("history"), dict)
    ):
        raise HistoryFileError(path, f"not a {FORMAT} file: expected an object with format {FORMAT!r} and history")
    if envelope.get("format_version") != FORMAT_VERSION:
        raise HistoryFileError(
            path,
            f"format version {json.dumps(envelope.get('format_version'))[:20]}; this trainer reads {FORMAT_VERSION}",
        )
    decoded = DecodedHistory(TrainerHistory(steps=[], payloads=[]))
    kept: dict[str, list[BaseModel]] = {}
    for name in _RECORDS:
        (kind,) = get_args(TrainerHistory.model_fields[name].annotation)
        items = envelope["history"].get(name, [])
        if not isinstance(items, list):
            decoded.skipped[name] = 1
            decoded.first_problem = decoded.first_problem or f"{name} is not a list"
            continue
        kept[name] = _records(items, TypeAdapter(kind), name, decoded)
    decoded.history = TrainerHistory(**kept)
    return decoded


def _records(items: Sequence[Any], adapter: TypeAdapter[Any], name: str, decoded: DecodedHistory) -> list[BaseModel]:
    """The items that validate, hold plausible values and follow the previous one (steps, then versions, in order)."""
    kept: list[BaseModel] = []
    for i, item in enumerate(items):
        try:
            record = adapter.validate_python(item)
            problem = _implausible(record) or _out_of_order(record, kept[-1] if kept else None)
        except ValidationError as e:
            first = e.errors()[0]
            problem = f"{'.'.join(str(p) for p in first['loc']) or 'record'}: {first['msg']}"
        if problem:
            decoded.skipped[name] = decoded.skipped.get(name, 0) + 1
            decoded.first_problem = decoded.first_problem or f"{name}[{i}]: {problem}"
            continue
        kept.append(record)
    return kept


def _implausible(record: BaseModel) -> str | None:
    """Why a record's values cannot be true (a negative count, a non-finite or absurdly large number), or None."""
    for key, value in record:
        values = (
            [*value.keys(), *value.values()]
            if isinstance(value, dict)
            else value
            if isinstance(value, list)
            else [value]
        )
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v) or abs(v) > _LARGEST:
                return f"{key} is not a finite number below {_LARGEST:.0e}"
            if v < 0 and key not in _SIGNED:
                return f"{key} is negative"
    return None


#: Largest magnitude a recorded number may have (2**53: every integer below it is exact as a float).
_LARGEST = 2.0**53


#: Fields whose values may be negative (rewards are penalties too).
_SIGNED = {"reward"}


def _out_of_order(record: BaseModel, previous: BaseModel | None) -> str | None:
    """Records follow each other: steps go up, and their versions never go down (publishing may fold several
    steps into one version); records without steps (payloads, anchors) go up by version."""
    step, version = getattr(record, "step", None), getattr(record, "version", None)
    if previous is None or version is None:
        return None
    previous_step, previous_version = getattr(previous, "step", None), getattr(previous, "version", None)
    if step is not None and step <= previous_step:
        return f"step {step} after step {previous_step}"
    if version < previous_version or (step is None and version == previous_version):
        return f"version {version} after version {previous_version}"
    return None


def up_to(history: TrainerHistory, version: int) -> TrainerHistory:
    """`history` without the records of versions after `version` (the bucket's newest): a trainer killed after a
    step was recorded and before its version was committed left them; their weights are gone."""
    kept = {name: [r for r in getattr(history, name) if getattr(r, "version", 0) <= version] for name in _RECORDS}
    return history.model_copy(update=kept)
