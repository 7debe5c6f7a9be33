"""Typed fields of the JSON a bucket holds (manifests), read as a stranger may have written them.

Each reader checks one field's JSON type and range and raises `DeltaFormatError` in one line naming
the field: a number is a JSON integer (never a bool, a float such as 1e400, or a string of digits in
any script), a text is a JSON string of bounded length, a list a JSON array. The message shows a short,
escaped form of the bad value, so neither a huge value nor a control character reaches a terminal.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import DeltaFormatError, shown

#: The largest integer a field may hold: sizes, versions, commits and ranks stay in a signed 64-bit word.
MAX_INT = 2**63 - 1


def loads(data: bytes, what: str) -> Any:
    """JSON from `data`, with NaN and infinities refused (JSON has neither).

    Raises:
        DeltaFormatError: not UTF-8 JSON, nested too deep, or holding NaN / Infinity.
    """

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a JSON number")

    try:
        return json.loads(data, parse_constant=refuse)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise DeltaFormatError(f"{what} is not valid JSON (torn write?): {shown(str(e), 120)}") from None


def integer(value: Any, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """`value` if it is a JSON integer in [lo, hi]."""
    if type(value) is not int or not lo <= value <= hi:
        raise DeltaFormatError(f"{what} must be an integer in [{lo}, {hi}], got {shown(value)}")
    return value


def optional_integer(value: Any, what: str, lo: int = 0, hi: int = MAX_INT) -> int | None:
    return None if value is None else integer(value, what, lo, hi)


def number(value: Any, what: str) -> float:
    """`value` if it is a finite JSON number (an integer or a float), as a float."""
    if type(value) not in (int, float) or not abs(value) < float("inf"):
        raise DeltaFormatError(f"{what} must be a finite number, got {shown(value)}")
    return float(value)


def text(value: Any, what: str, max_length: int = 4096) -> str:
    """`value` if it is a JSON string of 1 to `max_length` characters."""
    if type(value) is not str or not 0 < len(value) <= max_length:
        raise DeltaFormatError(f"{what} must be a string of 1 to {max_length} characters, got {shown(value)}")
    return value


def array(value: Any, what: str) -> list:
    if type(value) is not list:
        raise DeltaFormatError(f"{what} must be a JSON array, got {shown(value)}")
    return value


__all__ = ["array", "integer", "loads", "number", "obj", "optional_integer", "shown", "text"]


def obj(value: Any, what: str, required: tuple[str, ...] = ()) -> dict:
    """`value` if it is a JSON object holding every key of `required`."""
    if type(value) is not dict:
        raise DeltaFormatError(f"{what} must be a JSON object, got {shown(value)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise DeltaFormatError(f"{what} lacks {', '.join(missing)}")
    return value
