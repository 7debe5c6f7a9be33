"""Where a trainer goes on from in its bucket: the last of its own versions, found once (`Bucket.resume`).

A trainer's own versions are those its key signed, and, before its key's first, those of the key it hands over from
that its own records list (`trust.own_versions`, `Published`). Versions after its own (a stranger's, written by anyone
of the fleet) are said so and left behind; with none of its own, numbering goes on after the bucket's latest version
in a new run, whose first version is an anchor. Where versions after its own carry a valid signature of its key or of
the one it hands over from (a stolen key's: readers that trust that key may hold them), numbering goes on past them
too, with an anchor, so that no reader waits on a number a thief took. A bucket whose manifests are of an older
format starts a new run too (said in one line).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import DeltaFormatError
from ..signing import PublicKey
from ._files import Files
from .manifest import Manifest, VersionEntry, manifests_after, newest_manifest
from .published import Published
from .trust import own_versions, signed_by

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """What a trainer found of its own in its bucket.

    Attributes:
        manifest: The bucket's manifest cut after `version` (None: nothing of its own).
        version: Its last own version (0: none).
        run: The run id its versions carry (a new one when it has none), kept across restarts.
        newest: The bucket's latest version, whoever's (numbering goes on after it in a new run).
        past: Numbering goes on after `newest`, not `version`, with an anchor: versions after `version` carry a
            signature of the trainer's key or of the one it hands over from, not its own by its records.
    """

    manifest: Manifest | None
    version: int
    run: str
    newest: int
    past: bool = False

    @property
    def entry(self) -> VersionEntry | None:
        """The manifest's entry of `version` (None with none)."""
        return self.manifest.get(self.version) if self.manifest is not None else None

    @property
    def next_version(self) -> int:
        """The number of the next version published."""
        return (self.newest if self.past or not self.version else self.version) + 1


def find_resume(files: Files, key: PublicKey, earlier: Iterable[Published] = ()) -> Resume:
    """The last of `files`' versions signed by `key` (or, before its first, by one of the `earlier` keys, where their
    records list it), searched in the newest manifest and then the older ones (a stranger's manifest may hide the
    trainer's).

    Raises:
        BucketUnreachableError, StorageError: from the bucket.
    """
    earlier = list(earlier)
    new_run = secrets.token_hex(16)
    try:
        newest = newest_manifest(files)
    except DeltaFormatError as e:
        logger.warning("%s: no manifest of this format (%s): starting a new run with an anchor", files.url, e)
        return Resume(None, 0, new_run, 0)
    if newest is None:
        return Resume(None, 0, new_run, 0)
    latest = newest.latest.version if newest.latest else 0
    own, manifest = 0, newest
    for manifest in itertools.chain([newest], manifests_after(files, newest.commit)):
        own = own_versions(manifest, key, earlier)
        if own:
            break
    keys = {key.text} | {r.key.text for r in earlier}
    stolen: dict[int, str] = {}  # after its own, a valid signature of its key or of the one it hands over from
    for m in (newest, manifest):
        stolen.update({v.version: str(v.signer) for v in m.versions if v.version > own and signed_by(m, v, keys)})
    if stolen:
        first, last = min(stolen), max(stolen)
        latest = max(latest, last)
        logger.warning(
            "%s of %s signed by %s, %s: a stolen key's, as far as it can show; neither signed again nor resumed from: "
            "%s, numbering its next version %d (an anchor)",
            f"version {first}" if first == last else f"versions {first}..{last}",
            files.url,
            " or ".join(sorted({PublicKey.parse(signer).fingerprint for signer in stolen.values()})),
            f"not in this trainer's own records of what it signed ({', '.join(str(r.path) for r in earlier)})"
            if earlier
            else "after a version of someone else's",
            f"going on from version {own}" if own else "starting a new run",
            latest + 1,
        )
    if not own:
        if latest and not stolen:
            logger.warning(
                "no version of %s is signed by this trainer's key (%s): starting a new run at version %d; readers "
                "that trust another key refuse it (a new key is introduced with handover_from=the old key)",
                files.url,
                key.fingerprint,
                latest + 1,
            )
        return Resume(None, 0, new_run, latest)
    if own < latest and not stolen:
        logger.warning(
            "versions %d..%d of %s are not signed by this trainer's key (%s): someone else's, ignored; going on from "
            "version %d",
            own + 1,
            latest,
            files.url,
            key.fingerprint,
            own,
        )
    elif manifest is not newest and not stolen:
        logger.warning(
            "the newest manifest of %s lists versions not signed by this trainer's key (%s): someone else's, ignored; "
            "going on from version %d",
            files.url,
            key.fingerprint,
            own,
        )
    entry = manifest.get(own)
    assert entry is not None  # one of its own versions
    return Resume(manifest.upto(own), own, entry.run or new_run, latest, past=bool(stolen))
