"""`spaces/deploy.py` as a module for tests: it is a script beside the Spaces' folders, not a package."""

from __future__ import annotations

import sys
from types import ModuleType

from tests._env_server import REPO


def deploy_module() -> ModuleType:
    """`spaces/deploy.py`, imported with `spaces/` on the path while it imports (it imports nothing from there later)."""
    sys.path.insert(0, str(REPO / "spaces"))
    try:
        import deploy
    finally:
        sys.path.remove(str(REPO / "spaces"))
    return deploy
