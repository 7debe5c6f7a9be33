"""The trainer's keys: the one it signs with, the one it hands over from, and whose signatures are its own.

Rank 0 signs the versions (`delta.Publisher`) and the run's settings with its bucket's key (`delta.Bucket.signing_key`:
``DELTA_SIGNING_KEY``, else the key kept for the bucket). When that key replaces another, the previous one comes from a
file (`TrainerConfig.handover_from_file`) or ``DELTA_HANDOVER_FROM`` (`delta.signing.previous_key`; never a
command-line value: a private key must not show in ``ps``): the publisher signs the trainer's versions again with the
new key and commits them with a handover signed by the old one, and the run's settings carry the handovers that lead
to the key, so rollout servers that trust the old key (given, or on first use) follow the new one at once.

Every rank resumes only what rank 0's key signed (or, before that key's first version, what the key it hands over from
signed where rank 0's own records list it: `delta.Bucket.resume`): `TrainerKeys` carries the public half of this to
every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import delta
from delta.signing import Handover, PublicKey, handovers_to, make_handover

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
        """The trainer's trust in its own bucket (`delta.Trust.own`), for a rank that holds no key."""
        earlier = [PublicKey.parse(self.earlier)] if self.earlier is not None else []
        return delta.Trust.own(bucket, PublicKey.parse(self.key), earlier)


def trainer_keys(bucket: delta.Bucket) -> TrainerKeys:
    """What the other ranks need to know of rank 0's keys in its writer `bucket`: its key, the one it hands over from,
    and the handovers to its key (the bucket's, from the manifest of its resume, and its own).

    Raises:
        delta.KeyFormatError, delta.PrivateFileError: the key's file or variable holds no key, or is not private.
        delta.DeltaError, OSError: the bucket cannot be read.
    """
    key, previous = bucket.signing_key, bucket.handover_from
    if previous is not None and previous.public == key.public:
        logger.warning("the key to hand over from is this trainer's own key %s: no handover", key.public.fingerprint)
        previous = None
    manifest = bucket.resume().manifest
    known: tuple[Handover, ...] = manifest.handovers if manifest is not None else ()
    if previous is not None:
        known = (*known, make_handover(previous, key.public))
        logger.info(
            "signing key %s hands over to %s: rollout servers that trust it follow the new key",
            previous.public.fingerprint,
            key.public.fingerprint,
        )
    return TrainerKeys(
        key.public.text,
        previous.public.text if previous is not None else None,
        handovers_to(key.public, dict.fromkeys(known)),  # each once
    )
