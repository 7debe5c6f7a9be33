"""How the ranks of a sharded trainer agree: tiny collectives on a gloo group, and shard records in
the bucket that rank 0 gathers before it commits a version."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..retry import RetryPolicy
from ._files import Files
from .manifest import MAX_MANIFEST_BYTES, FileRef, Manifest, newest_manifest

#: How often a rank looks for the others' records or rank 0's commit: quickly at first (ranks finish a
#: publish close together), then every second at most, so a rank kept waiting does not list a remote
#: bucket twenty times a second.
_POLL = RetryPolicy(None, first_delay=0.05, max_delay=1.0)


def broadcast_object(value: Any, group: Any = None) -> Any:
    """The first rank of `group`'s `value` (any picklable object), returned on every rank of it.

    Args:
        value: What the group's first rank sends; the other ranks' values are ignored.
        group: A torch.distributed process group (gloo, so the object travels on the CPU); None: the default
            group.

    Blocks until every rank of the group has called it (a collective: call it on all of them, in the same
    order as their other collectives).
    """
    box = [value]
    source = torch.distributed.get_global_rank(group, 0) if group is not None else 0
    torch.distributed.broadcast_object_list(box, src=source, group=group)
    return box[0]


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's ranks (rank 0 of 1 without torch.distributed).

    Attributes:
        rank: This rank.
        world: Number of ranks.
        group: The gloo process group, or None for one rank.
    """

    rank: int = 0
    world: int = 1
    group: Any = None

    @classmethod
    def create(cls, group: Any = None) -> Ranks:
        """From `group`, else the default group when torch.distributed is initialised, else one rank."""
        dist = torch.distributed
        if group is None and not (dist.is_available() and dist.is_initialized()):
            return cls()
        world = dist.get_world_size(group)
        if world == 1:
            return cls()
        backend = dist.get_backend(group)
        if backend != "gloo":
            raise ValueError(
                f"the publisher's process group uses {backend!r}; pass group=torch.distributed."
                "new_group(backend='gloo') so its small CPU collectives do not touch the training group"
            )
        return cls(dist.get_rank(group), world, group)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank."""
        return value if self.world == 1 else broadcast_object(value, self.group)

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any."""
        return self._reduce(flag, torch.distributed.ReduceOp.MAX)

    def all(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on all."""
        return self._reduce(flag, torch.distributed.ReduceOp.MIN)

    def _reduce(self, flag: bool, op: Any) -> bool:
        if self.world == 1:
            return flag
        t = torch.tensor([int(flag)])
        torch.distributed.all_reduce(t, op=op, group=self.group)
        return bool(t.item())

    def submit(self, files: Files, folder: str, record: dict) -> None:
        """Another rank: write this rank's record (its files and tensor digests) after its files."""
        body = dict(record, delta=[asdict(f) for f in record["delta"]], anchor=[asdict(f) for f in record["anchor"]])
        files.write(f"{folder}rank-{self.rank:05d}.json", json.dumps(body, sort_keys=True).encode())

    def collect(self, files: Files, folder: str, timeout: float) -> list[dict]:
        """Rank 0: wait for the other ranks' records of this version and return them.

        Raises:
            TimeoutError: not all records came within `timeout` seconds.
        """
        wanted = {f"{folder}rank-{r:05d}.json" for r in range(1, self.world)}
        if not wanted:  # one rank: nothing to wait for, nothing to list
            return []
        deadline = time.monotonic() + timeout
        polls = 0
        while not wanted <= {f.path for f in files.list(f"{folder}rank-")}:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ranks' records missing in {folder} after {timeout:.0f} s; is every rank publishing?"
                )
            polls += 1
            time.sleep(_POLL.delay(polls))
        records = []
        for path in sorted(wanted):
            body = json.loads(files.read(path, max_bytes=MAX_MANIFEST_BYTES))  # one rank's part of a manifest
            body["delta"] = [FileRef(**f) for f in body["delta"]]
            body["anchor"] = [FileRef(**f) for f in body["anchor"]]
            records.append(body)
        return records

    def wait_commit(self, files: Files, version: int, folder: str, timeout: float) -> Manifest:
        """Another rank: wait until rank 0 committed `version` with this publish's files.

        Raises:
            TimeoutError: no such commit within `timeout` seconds.
            RuntimeError: the version was committed with other files (a second writer).
        """
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            manifest = newest_manifest(files)
            entry = manifest.get(version) if manifest else None
            if entry is not None:
                if not all(f.path.startswith(folder) for f in entry.files):
                    raise RuntimeError(
                        f"version {version} was committed with files outside {folder}: another "
                        "publisher writes to this bucket"
                    )
                assert manifest is not None  # it lists the version
                return manifest
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not commit version {version} within {timeout:.0f} s")
            polls += 1
            time.sleep(_POLL.delay(polls))
