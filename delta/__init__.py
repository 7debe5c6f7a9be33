"""delta: bit-exact sparse weight deltas for shipping model updates through object storage.

    >>> import delta
    >>> data = delta.diff(old_state, new_state, version=2, base_version=1)
    >>> delta.apply(reader_state, data)          # in place, all or nothing
"""

from .apply import ApplyResult, apply, decode, write_changes
from .codecs import CODECS, DEFAULT_CODEC
from .diff import diff
from .errors import DeltaError, DeltaFormatError, IntegrityError, StateMismatchError
from .format import DeltaHeader, TensorEntry, read_delta
from .hashing import StateDigest, state_digest
from .state import State, load_state, save_state

__all__ = [
    "CODECS", "DEFAULT_CODEC", "ApplyResult", "DeltaError", "DeltaFormatError", "DeltaHeader", "IntegrityError",
    "State", "StateDigest", "StateMismatchError", "TensorEntry", "apply", "decode", "diff", "load_state",
    "read_delta", "save_state", "state_digest", "write_changes",
]
