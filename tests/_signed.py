"""Manifests signed again with the bucket's trainer key, for tests of the checks that lie behind the signature.

A forgery signed this way is what only a trainer with a bug, or someone holding its key, could commit: the readers'
other checks (paths, sizes, hashes, layouts) must still refuse it. The key is the one `delta.Publisher` made for the
bucket in the tests' cache (`tests/conftest.py`).
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from delta import Manifest, Storage
from delta.signing import trainer_key


def signed(storage: Storage, manifest: Manifest) -> Manifest:
    """`manifest` with every version signed by `storage`'s trainer key, as versions of the run they name."""
    key = trainer_key(storage.url)
    run = next((v.run for v in manifest.versions if v.run), secrets.token_hex(16))
    unsigned = replace(manifest, versions=tuple(replace(v, run=v.run or run, signer=key.public.text, signature=None)
                                                for v in manifest.versions))
    return replace(unsigned, versions=tuple(replace(v, signature=key.sign(unsigned.signed_bytes(v)))
                                            for v in unsigned.versions))
