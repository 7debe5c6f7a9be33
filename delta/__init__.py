"""delta: bit-exact sparse weight deltas for shipping model updates through object storage.

    >>> import delta
    >>> data = delta.diff(old_state, new_state, version=2, base_version=1)
    >>> delta.apply(reader_state, data)          # in place, all or nothing

Through a bucket: open it once (`Bucket.open(url)`: its storage, shared listing, request budget, keys and trust),
then `Publisher` on the trainer (signing each version) and `Subscriber` on each reader (applying only what the
trainer signed) (docs/delta.md).

The public API is what `__all__` lists, plus the modules `delta.storage` (the backends), `delta.errors`,
`delta.signing` (keys and their handovers), `delta.private` (owner-only files), `delta.replies` (bounded HTTP
replies), `delta.atomic` (atomic file writes), `delta.poll` (how a poller waits), `delta.follow` and
`delta.integrations.*`, each with its own `__all__`. The layers below, each a folder, import only downwards:
`tensors` < `codecs` < `format` (one delta file) < `patch` (diff and apply) < `bucket` (manifest, publish,
subscribe), with `storage` beside them.
"""

from .bucket import pieces
from .bucket.budget import Budget
from .bucket.handle import Bucket, read_manifest
from .bucket.manifest import FileRef, Manifest, VersionEntry
from .bucket.publish import PublishedVersion, Publisher, PublisherConfig
from .bucket.subscribe import Subscriber, SubscriberConfig, SubscriberStatus, Update, VersionStats
from .bucket.trust import Trust
from .codecs import CODECS, DEFAULT_CODEC, Change, Workspace
from .errors import (
    DeltaError,
    DeltaFormatError,
    IntegrityError,
    NoPathError,
    PublishError,
    StateMismatchError,
    StorageError,
    UntrustedVersionError,
)
from .format import DeltaHeader, TensorEntry, read_delta
from .patch.apply import ApplyResult, Rollback, apply, decode, write_changes
from .patch.diff import diff
from .signing import PublicKey, SigningKey
from .storage import Storage, StoredFile
from .tensors.hashing import StateDigest, state_digest
from .tensors.state import load_state, save_state

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "ApplyResult",
    "Bucket",
    "Budget",
    "Change",
    "DeltaError",
    "DeltaFormatError",
    "DeltaHeader",
    "FileRef",
    "IntegrityError",
    "Manifest",
    "NoPathError",
    "PublicKey",
    "PublishError",
    "PublishedVersion",
    "Publisher",
    "PublisherConfig",
    "Rollback",
    "SigningKey",
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
    "decode",
    "diff",
    "load_state",
    "pieces",
    "read_delta",
    "read_manifest",
    "save_state",
    "state_digest",
    "write_changes",
]
