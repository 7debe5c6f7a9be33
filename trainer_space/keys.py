"""The trainer's keys: the one it signs with, the one it hands over from, and whose signatures are its own.

Rank 0 signs the versions (`delta.Publisher`) and the run's settings with `delta.trainer_key` (``DELTA_SIGNING_KEY``,
else the key kept for the bucket). When that key replaces another, the previous one comes from a file
(`TrainerConfig.handover_from_file`) or ``DELTA_HANDOVER_FROM`` (`delta.previous_key`; never a command-line value: a
private key must not show in ``ps``): the publisher signs the trainer's versions again with the new key and commits them
with a handover signed by the old one, and the run's settings carry the handovers that lead to the key, so rollout
servers that trust the old key (given, or on first use) follow the new one at once. Without it, a trainer with a new
key finds none of its versions and starts a new run, which those servers refuse.

Every rank resumes only what rank 0's key signed (or, before that key's first version, the key it hands over from):
`TrainerKeys` carries the public half of this to every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import delta
from delta import Handover, PublicKey, SigningKey, handovers_to, make_handover

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerKeys:
    """What every rank knows of rank 0's keys: public texts and handovers, never a private key (it is broadcast).

    Attributes:
        key: The public key text rank 0 signs with.
        earlier: The public key text of the key it hands over from (None: it hands over from none).
        handovers: The valid handovers that lead to `key` (the bucket's, and its own): written with the run's settings.
    """

    key: str
    earlier: str | None = None
    handovers: tuple[Handover, ...] = ()

    def trust(self, bucket: str) -> delta.Trust:
        """The trainer's trust in its own bucket (`delta.Trust.own`)."""
        url = delta.open_storage(bucket).url
        earlier = [PublicKey.parse(self.earlier)] if self.earlier is not None else []
        return delta.Trust.own(url, PublicKey.parse(self.key), earlier)


def load_keys(bucket: str, handover_from_file: str | None = None) -> tuple[SigningKey, SigningKey | None, TrainerKeys]:
    """Rank 0's keys for `bucket`: the key it signs with, the one it hands over from (None: none, or the same key), and
    what the other ranks need to know of them. Reads the bucket's manifest once, for its handovers.

    Raises:
        delta.KeyFormatError: a key's file or variable holds no key (never quoted).
        delta.PrivateFileError: a key's file is a link, a FIFO, a folder or another user's.
        FileNotFoundError: there is no file at `handover_from_file`.
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    storage = delta.open_storage(bucket)
    key = delta.trainer_key(storage.url)
    previous = delta.previous_key(handover_from_file)
    if previous is not None and previous.public == key.public:
        logger.warning("the key to hand over from is this trainer's own key %s: no handover", key.public.fingerprint)
        previous = None
    manifest = delta.read_manifest(storage)
    known = manifest.handovers if manifest is not None else ()
    if previous is not None:
        known = (*known, make_handover(previous, key.public))
        logger.info(
            "signing key %s hands over to %s: rollout servers that trust it follow the new key",
            previous.public.fingerprint,
            key.public.fingerprint,
        )
    keys = TrainerKeys(
        key.public.text,
        previous.public.text if previous is not None else None,
        handovers_to(key.public, dict.fromkeys(known)),  # each once
    )
    return key, previous, keys
