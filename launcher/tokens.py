"""The secrets the local apps share: the env's token (the rollout sends it), the rollout's (the trainer sends it;
the fleet's files and the exam records are signed with a key made from it) and the owner's (the trainer's
start/pause/stop).

Each is taken from its variable (ENV_TOKEN, ROLLOUT_TOKEN, OWNER_TOKEN / ``--owner-token``) when it is set: an
explicit token always wins. Otherwise the launcher makes one at the first start on a bucket and keeps it in a
local file (`KeptTokens`: one file per bucket, readable by its owner only, never in the bucket), so the next
start on that bucket uses the same ones: the exam records and run settings written before a restart are still
signed with the run's key, and a script that calls the rollout keeps working. The tokens reach the children in
their environment, never in argv (where ``ps`` shows them to every local user).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

import settings
from delta.errors import PrivateFileError
from delta.private import read_private, write_private

logger = logging.getLogger(__name__)

#: Which token variables each role reads: the env and the rollout check theirs; the rollout and the
#: trainer send the other side's.
ROLE_TOKENS = {"env": ("ENV_TOKEN",), "rollout": ("ENV_TOKEN", "ROLLOUT_TOKEN"), "trainer": ("ROLLOUT_TOKEN",)}
#: The tokens the launcher keeps, with the number of random bytes of a fresh one.
KEPT = {"ENV_TOKEN": 24, "ROLLOUT_TOKEN": 24, "OWNER_TOKEN": 12}
#: What a kept token may look like (what `secrets.token_urlsafe` makes); anything else in the file is ignored.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")


class KeptTokens:
    """The tokens the launcher made for one bucket, in a local file only its owner can read (0600, in a 0700
    folder; read and written as `delta.private` files). Not thread-safe; one launcher per bucket at a time.

    Args:
        folder: Where the files live (the launcher's ``--keys``, default ``.cache/app/keys`` in the repository).
        bucket: The bucket's URL: each bucket has its own tokens (its file is named by the URL's hash).
    """

    def __init__(self, folder: str, bucket: str) -> None:
        self.bucket = bucket
        self.path = Path(folder) / f"{hashlib.sha256(bucket.encode()).hexdigest()[:16]}.json"

    def read(self) -> dict[str, str]:
        """The tokens kept for the bucket ({} when none are, or the file is not one of ours: it is then replaced
        at the next `write`). A file others could read is made owner-only first (and said so in the log).

        Raises:
            delta.PrivateFileError: a link, a FIFO, a folder or another user's file is where the tokens belong:
                refused in one line, never followed.
        """
        try:
            data = read_private(self.path)
            if data is None:
                return {}
            kept = json.loads(data)
        except PrivateFileError:
            raise
        except (OSError, ValueError) as e:
            logger.warning("ignoring the kept tokens in %s (new ones are made): %s", self.path, e)
            return {}
        if not isinstance(kept, dict) or kept.get("bucket") != self.bucket:
            return {}
        return {k: v for k, v in kept.items() if k in KEPT and isinstance(v, str) and _TOKEN.fullmatch(v)}

    def write(self, tokens: Mapping[str, str]) -> None:
        """Replace the file with `tokens`, atomically (a new file created 0600, then renamed over the old one)."""
        write_private(self.path, json.dumps({"bucket": self.bucket, **tokens}, indent=1).encode())


def launch_tokens(
    environ: Mapping[str, str] | None = None, kept: KeptTokens | None = None, owner_token: str | None = None
) -> dict[str, str]:
    """ENV_TOKEN, ROLLOUT_TOKEN and OWNER_TOKEN for this start: each as set in `environ` (the process environment
    when None; `owner_token` for the owner's, the ``--owner-token`` flag), else the one `kept` for the bucket,
    else fresh. The tokens the launcher made (kept or fresh) are written back to `kept`; an explicit one is
    never written to disk."""
    given = {
        "ENV_TOKEN": settings.ENV_TOKEN.value(environ),
        "ROLLOUT_TOKEN": settings.ROLLOUT_TOKEN.value(environ),
        "OWNER_TOKEN": owner_token if owner_token is not None else settings.OWNER_TOKEN.value(environ),
    }
    before = kept.read() if kept is not None else {}
    made = {name: before.get(name) or secrets.token_urlsafe(size) for name, size in KEPT.items() if not given[name]}
    if kept is not None and {**before, **made} != before:
        kept.write({**before, **made})
    return {name: given[name] or made[name] for name in KEPT}


def role_environ(role: str, tokens: dict[str, str]) -> dict[str, str]:
    """The token variables to set for ``role``'s process."""
    return {name: tokens[name] for name in ROLE_TOKENS[role]}
