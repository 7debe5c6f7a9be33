"""Run Python code in a child process whose memory is capped (`resource.setrlimit(RLIMIT_AS)`) a little above what its
imports take: reading a 2 GB file whole there raises MemoryError, so a reader that keeps answering proves its reads
are bounded. The files are made sparse (`sparse`), so they cost no disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the child may allocate beyond its imports.
HEADROOM = 768 << 20
#: The size of the files the acceptance asks for.
HUGE = 2 << 30


def sparse(path: Path, size: int = HUGE, head: bytes = b"") -> Path:
    """A file of `size` bytes that starts with `head` and takes no disk for the rest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def run_capped(setup: str, body: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `setup` (imports, fixtures), then cap the address space at what it uses plus `HEADROOM`, then run `body`;
    returns the finished child (its output text), having checked that it exited without an error (a MemoryError
    or any other traceback fails the test with the end of its output)."""
    code = "\n".join([
        setup,
        "import resource as _r",
        "_used = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024",
        f"_r.setrlimit(_r.RLIMIT_AS, (_used + {HEADROOM}, _r.getrlimit(_r.RLIMIT_AS)[1]))",
        body,
    ])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2"}  # threads reserve no arena each
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done
