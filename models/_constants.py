"""Environment variables of the `models` package, read once, here and nowhere else."""

import os

#: Root of the on-disk caches (converted SmolLM2 folder, ...). Override with DELTA_SYNC_CACHE.
CACHE_DIR: str = os.environ.get("DELTA_SYNC_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "delta-sync"))
