"""Catch-up planning: cheapest route by bytes, bad files avoided."""

from __future__ import annotations

import pytest

from delta import FileRef, Manifest, VersionEntry
from delta.bucket.catchup import NoPathError, plan


def manifest(anchors: set[int], last: int, delta_size: int = 100, anchor_size: int = 1000) -> Manifest:
    m = Manifest(0)
    for v in range(1, last + 1):
        delta = (FileRef(f"versions/{v:08d}-a/d", delta_size, "0"),) if v > 1 else ()
        anchor = (FileRef(f"versions/{v:08d}-a/a", anchor_size, "0"),) if v in anchors else ()
        m = m.with_version(VersionEntry(v, "anchor" if anchor else "delta", v - 1 if delta else None,
                                        f"h{v - 1}" if delta else None, f"h{v}", delta, anchor))
    return m


def route(steps):
    return [(s.entry.version, s.via) for s in steps]


def test_cheapest_route():
    m = manifest({1, 11}, 14)
    assert route(plan(m, 14, have=12, have_hash="h12")) == [(13, "delta"), (14, "delta")]
    # Far behind: the newest anchor and three deltas beat thirteen deltas.
    assert route(plan(m, 14, have=1, have_hash="h1")) == [(11, "anchor"), (12, "delta"), (13, "delta"), (14, "delta")]
    assert route(plan(m, 14)) == route(plan(m, 14, have=1, have_hash="h1"))
    # A state that is not what the manifest says: only anchors.
    assert route(plan(m, 12, have=11, have_hash="other")) == [(11, "anchor"), (12, "delta")]
    assert plan(m, 14, have=14, have_hash="h14") == []


def test_bad_files_are_avoided():
    m = manifest({1, 13}, 14)
    assert route(plan(m, 14, have=12, have_hash="h12")) == [(13, "delta"), (14, "delta")]
    assert route(plan(m, 14, have=12, have_hash="h12", avoid={"versions/00000013-a/d"})) == [
        (13, "anchor"), (14, "delta")]
    with pytest.raises(NoPathError, match="no usable route"):
        plan(m, 14, have=12, have_hash="h12", avoid={"versions/00000014-a/d"})
    with pytest.raises(NoPathError, match="not in the manifest"):
        plan(m, 15)


def test_a_manifest_of_thousands_of_anchors_is_planned_exactly():
    """Planning prices every start in one pass (bench/catchup.py measures it: docs/benchmarks.md); here, that the
    plan on an 8,000-anchor manifest is the cheapest one, from every kind of start."""
    from bench.catchup import big_manifest

    m = big_manifest(8000)
    assert Manifest.from_json(m.to_json()) == m
    assert route(plan(m, 8000)) == [(8000, "anchor")]
    assert route(plan(m, 8000, have=7990, have_hash=f"sum128:{7990:032x}")) == [(v, "delta") for v in range(7991, 8001)]
    # deltas of 1.5 MB against anchors of 270 MB: 179 deltas are still cheaper than an anchor, 181 are not
    assert route(plan(m, 8000, have=7821, have_hash=f"sum128:{7821:032x}"))[0] == (7822, "delta")
    assert route(plan(m, 8000, have=7819, have_hash=f"sum128:{7819:032x}")) == [(8000, "anchor")]
    avoid = {m.get(8000).anchor[0].path}
    assert route(plan(m, 8000, avoid=avoid)) == [(7999, "anchor"), (8000, "delta")]
    assert route(plan(m, 4000, have=2, have_hash="other")) == [(4000, "anchor")]
