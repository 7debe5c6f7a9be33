"""Catch-up planning: the cheapest way from the version a reader holds to a target version.

Pure functions over a manifest (no I/O), so plans are easy to test and to print.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NoPathError
from .manifest import FileRef, Manifest, VersionEntry


@dataclass(frozen=True)
class Step:
    """One step of a plan: load a version's anchor, or apply its delta.

    Attributes:
        entry: The version reached by this step.
        via: "anchor" or "delta".
    """

    entry: VersionEntry
    via: str

    @property
    def files(self) -> tuple[FileRef, ...]:
        return self.entry.anchor if self.via == "anchor" else self.entry.delta

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def plan(
    manifest: Manifest,
    target: int,
    *,
    have: int | None = None,
    have_hash: str | None = None,
    avoid: frozenset[str] | set[str] = frozenset(),
) -> list[Step]:
    """The steps with the fewest bytes to fetch that take a reader from `have` to `target`.

    Candidates: the deltas after `have` (only if the first one's base hash is `have_hash`, the
    reader's actual state), or any anchor at or below `target` followed by the deltas after it. Files
    in `avoid` (found bad) are never used. Ties go to the route with fewer steps.

    Args:
        manifest: The committed versions.
        target: The version wanted; must be in the manifest.
        have: The reader's version, or None when it holds no usable state.
        have_hash: The reader's state hash.
        avoid: Paths that must not be used.

    Raises:
        NoPathError: no route avoids the bad files, or `target` is not in the manifest.
    """
    if manifest.get(target) is None:
        raise NoPathError(
            f"version {target} is not in the manifest (versions "
            f"{manifest.versions[0].version if manifest.versions else '-'}.."
            f"{manifest.latest.version if manifest.latest else '-'})",
            target=target,
        )
    if have == target:
        return []
    first = manifest.versions[0].version

    def usable(files: tuple[FileRef, ...]) -> bool:
        return bool(files) and not any(f.path in avoid for f in files)

    # deltas[v - first] = bytes of the deltas v+1..target, or None if one of them is unusable: one pass.
    deltas: list[int | None] = [None] * (target - first + 1)
    deltas[-1] = total = 0
    for v in range(target, first, -1):
        entry = manifest.get(v)
        if entry is None or not (usable(entry.delta) and entry.base_version == v - 1):
            break
        deltas[v - 1 - first] = total = total + entry.delta_bytes

    # Each candidate start costs O(1) to price; only the cheapest is spelled out as steps.
    best: tuple[int, int, int, str] | None = None  # (bytes, steps, start version, "delta" | "anchor")
    if have is not None and have_hash is not None and first <= have < target:
        cost, following = deltas[have - first], manifest.get(have + 1)
        if cost is not None and following is not None and following.base_hash == have_hash:
            best = (cost, target - have, have, "delta")
    for anchor in manifest.anchors():
        cost = deltas[anchor.version - first] if anchor.version <= target else None
        if cost is not None and usable(anchor.anchor):
            route = (anchor.anchor_bytes + cost, target - anchor.version + 1, anchor.version, "anchor")
            if best is None or route[:2] < best[:2]:
                best = route
    if best is None:
        raise NoPathError(
            f"no usable route to version {target} from {have}: every route crosses a bad or "
            f"missing file (avoided: {sorted(avoid)[:3]}); wait for a newer anchor",
            target=target,
        )
    _, _, start, via = best

    def listed(version: int) -> VersionEntry:
        entry = manifest.get(version)
        assert entry is not None  # the route was priced from these versions' entries
        return entry

    steps = [Step(listed(start), "anchor")] if via == "anchor" else []
    return steps + [Step(listed(v), "delta") for v in range(start + 1, target + 1)]
