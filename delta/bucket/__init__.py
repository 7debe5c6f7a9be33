"""Versions of a state through a bucket (docs/delta.md, "Publishing through a bucket").

The manifest (`manifest`) is the commit; a version is an anchor (`anchors`, a full snapshot) or deltas.
The writer side is `publish` (with `_ranks` for several ranks, `pieces` for sharded tensors, `retention`
for garbage); the reader side is `reader` (route planning in
`catchup`, then fetch, verify, decode, write), which both `subscribe` and the publisher's resume use.
"""
