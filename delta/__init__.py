"""delta: bit-exact sparse weight deltas for shipping model updates through object storage.

    >>> import delta
    >>> data = delta.diff(old_state, new_state, version=2, base_version=1)
    >>> delta.apply(reader_state, data)          # in place, all or nothing

Through a bucket: `Publisher` on the trainer, `Subscriber` on each reader (see README).
"""

from . import pieces
from ._ranks import broadcast_object
from .apply import ApplyResult, apply, decode, write_changes
from .codecs import CODECS, DEFAULT_CODEC
from .diff import diff
from .errors import (
    BucketUnreachableError, DeltaError, DeltaFormatError, IntegrityError, NoPathError, PublishError,
    StateMismatchError, StorageError,
)
from .format import DeltaHeader, TensorEntry, read_delta
from .hashing import StateDigest, state_digest
from .manifest import Manifest, VersionEntry, read_manifest
from .publish import PublishedVersion, Publisher, PublisherConfig
from .retry import RetryPolicy
from .state import State, load_state, save_state
from .storage import Storage, open_storage
from .subscribe import Subscriber, SubscriberConfig, SubscriberStatus, Update, VersionStats

__all__ = [
    "CODECS", "DEFAULT_CODEC", "ApplyResult", "BucketUnreachableError", "DeltaError", "DeltaFormatError",
    "DeltaHeader", "IntegrityError", "Manifest", "NoPathError", "PublishError", "PublishedVersion", "Publisher",
    "PublisherConfig", "RetryPolicy", "State", "StateDigest", "StateMismatchError", "Storage", "StorageError",
    "Subscriber", "SubscriberConfig", "SubscriberStatus", "TensorEntry", "Update", "VersionEntry", "VersionStats",
    "apply", "broadcast_object", "decode", "diff", "load_state", "open_storage", "pieces", "read_delta", "read_manifest", "save_state",
    "state_digest", "write_changes",
]
