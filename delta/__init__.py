"""delta: bit-exact sparse weight deltas for shipping model updates through object storage.

    >>> import delta
    >>> data = delta.diff(old_state, new_state, version=2, base_version=1)
    >>> delta.apply(reader_state, data)          # in place, all or nothing

Through a bucket: `Publisher` on the trainer (signing each version with its key), `Subscriber` on each reader
(applying only what that key signed: `Trust`) (docs/delta.md).

The public API is what `__all__` lists, plus `delta.storage` (the backends) and the modules of
`delta.integrations` and `delta.follow`, each with its own `__all__`. The layers below it, each a folder,
import only downwards: `tensors` (bit views, hashes, state files, the host/device seam) < `codecs` <
`format` (one delta file) < `patch` (diff and apply) < `bucket` (manifest, publish, subscribe), with
`storage`, `errors`, `retry`, `atomic` and `replies` (bounded HTTP replies) beside them.
"""

from .atomic import atomic_path, write_atomic
from .bucket import pieces
from .bucket._ranks import broadcast_object
from .bucket.manifest import FileRef, Handover, Manifest, PolledManifests, VersionEntry, read_manifest
from .bucket.publish import PublishedVersion, Publisher, PublisherConfig
from .bucket.subscribe import Subscriber, SubscriberConfig, SubscriberStatus, Update, VersionStats
from .bucket.trust import Trust, handovers_to, make_handover, own_versions
from .codecs import CODECS, DEFAULT_CODEC, Change, Workspace
from .errors import (
    AccessDeniedError,
    BucketNotFoundError,
    BucketUnreachableError,
    DeltaError,
    DeltaFormatError,
    FileTooLargeError,
    IntegrityError,
    KeyFormatError,
    NoPathError,
    PrivateFileError,
    PublishError,
    RateLimitedError,
    ReplyLimitError,
    StateMismatchError,
    StorageError,
    UntrustedVersionError,
)
from .format import DeltaHeader, TensorEntry, read_delta
from .patch.apply import ApplyResult, Rollback, apply, decode, write_changes
from .patch.diff import diff
from .poll import Backoff
from .private import read_private, write_private
from .replies import read_reply
from .retry import RetryPolicy
from .signing import PublicKey, SigningKey, kept_previous_key, previous_key, rotate_trainer_key, trainer_key
from .storage import Storage, StoredFile, open_storage
from .tensors.hashing import StateDigest, state_digest
from .tensors.state import State, load_state, save_state

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "AccessDeniedError",
    "ApplyResult",
    "Backoff",
    "BucketNotFoundError",
    "BucketUnreachableError",
    "Change",
    "DeltaError",
    "DeltaFormatError",
    "DeltaHeader",
    "FileRef",
    "FileTooLargeError",
    "Handover",
    "IntegrityError",
    "KeyFormatError",
    "Manifest",
    "NoPathError",
    "PolledManifests",
    "PrivateFileError",
    "PublicKey",
    "PublishError",
    "PublishedVersion",
    "Publisher",
    "PublisherConfig",
    "RateLimitedError",
    "ReplyLimitError",
    "RetryPolicy",
    "Rollback",
    "SigningKey",
    "State",
    "StateDigest",
    "StateMismatchError",
    "Storage",
    "StorageError",
    "StoredFile",
    "Subscriber",
    "SubscriberConfig",
    "SubscriberStatus",
    "TensorEntry",
    "Trust",
    "UntrustedVersionError",
    "Update",
    "VersionEntry",
    "VersionStats",
    "Workspace",
    "apply",
    "atomic_path",
    "broadcast_object",
    "decode",
    "diff",
    "handovers_to",
    "kept_previous_key",
    "load_state",
    "make_handover",
    "open_storage",
    "own_versions",
    "pieces",
    "previous_key",
    "read_delta",
    "read_manifest",
    "read_private",
    "read_reply",
    "rotate_trainer_key",
    "save_state",
    "state_digest",
    "trainer_key",
    "write_atomic",
    "write_changes",
    "write_private",
]
