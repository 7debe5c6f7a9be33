"""A version checked as a whole before anything of it is written: its files against each other, and
against the state a reader holds.

A version written by several ranks is several files that a reader decodes against the same old state
and writes one after another. If two files could change the same tensor, or a file could claim a rank
that does not exist, the state written would be none that the manifest describes. So, at parse time
(`check_manifest`): every tensor name is held by exactly one rank (`shards`), a version's delta files
are one per rank of its world, its anchor files cover every rank, each file path appears once, and kind,
base version and base hash agree with the files listed. Before a step is decoded (`check_step`): every
name the step's files may write exists in the reader's state. Tiling of sharded tensors is
`pieces.check_layout`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from ..errors import DeltaFormatError, StateMismatchError
from ._fields import shown

Shards = tuple[tuple[str, ...], ...]


class File(Protocol):
    """What is checked of a version's file (`manifest.FileRef`): read only."""

    @property
    def path(self) -> str: ...
    @property
    def rank(self) -> int: ...


class Version(Protocol):
    """What is checked of a version (`manifest.VersionEntry`): read only."""

    @property
    def version(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def base_version(self) -> int | None: ...
    @property
    def base_hash(self) -> str | None: ...
    @property
    def delta(self) -> tuple[File, ...]: ...
    @property
    def anchor(self) -> tuple[File, ...]: ...


def check_manifest(shards: Shards | None, versions: Sequence[Version]) -> None:
    """Refuse a manifest whose ranks' names (`shards`) overlap, or any of whose `versions` is not whole.

    Raises:
        DeltaFormatError: naming the version (or tensor) and what is wrong.
    """
    held: set[str] = set()
    for rank, names in enumerate(shards or ()):
        for name in names:
            if name in held:
                raise DeltaFormatError(
                    f"tensor {shown(name)} is held by two ranks (or twice by rank {rank}) in "
                    "shards: each tensor belongs to exactly one rank"
                )
            held.add(name)
    numbers = [v.version for v in versions]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise DeltaFormatError(f"manifest versions are not consecutive: {shown(numbers, 80)}")
    world = len(shards) if shards is not None else 1
    for entry in versions:
        check_version(entry, world)


def check_version(entry: Version, world: int) -> None:
    """Refuse a version whose files do not make one version of a `world`-rank writer.

    Raises:
        DeltaFormatError: what is wrong, naming the version.
    """
    v = entry.version
    if (entry.kind == "anchor") != bool(entry.anchor):
        raise DeltaFormatError(f"version {v} is of kind {entry.kind!r} with {len(entry.anchor)} anchor files")
    if entry.delta and (entry.base_version != v - 1 or entry.base_hash is None):
        raise DeltaFormatError(
            f"version {v} carries a delta but its base is version {shown(entry.base_version)} "
            f"with hash {shown(entry.base_hash)} (must be version {v - 1} and its hash)"
        )
    if not entry.delta and (entry.base_version is not None or entry.base_hash is not None):
        raise DeltaFormatError(f"version {v} names a base but carries no delta")
    if not entry.delta and not entry.anchor:
        raise DeltaFormatError(f"version {v} has no files")
    paths = [f.path for f in entry.delta + entry.anchor]
    if len(set(paths)) != len(paths):
        raise DeltaFormatError(f"version {v} lists a file twice")
    if entry.delta:
        ranks = sorted(f.rank for f in entry.delta)
        if ranks != list(range(world)):
            raise DeltaFormatError(
                f"version {v}'s delta files are of ranks {shown(ranks, 60)}; a version of {world} "
                f"rank(s) has one delta file per rank"
            )
    if entry.anchor:
        missing = sorted(set(range(world)) - {f.rank for f in entry.anchor})
        if missing:
            raise DeltaFormatError(f"version {v}'s anchor has no file of rank(s) {shown(missing, 60)}")


def check_step(delta_files: Sequence[File], shards: Shards | None, state: Collection[str] | None) -> None:
    """Refuse the delta files of a step if they would write tensors `state` (the names a reader holds) lacks.

    Raises:
        StateMismatchError: a name of a rank's `shards` is not in the state (one line, the name escaped).
    """
    if shards is None or state is None:
        return
    for ref in delta_files:
        missing = next((n for n in shards[ref.rank] if n not in state), None)
        if missing is not None:
            raise StateMismatchError(
                f"rank {ref.rank}'s tensors in the manifest include {shown(missing)}, which the "
                "state does not hold; this bucket was written for another model"
            )
