"""A publisher's host copy of the state it last published, for states that live on a GPU.

Hashing and anchors need the state's bytes on the host. Reading a GPU state back whole every version
would copy it all over PCIe; instead the mirror is copied once, then follows each new version with only
the elements that changed (found on the device), and only the tensors that changed are hashed again.
Not yet run on a GPU: the same torch code is tested with CPU tensors through `_device`'s seam.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..patch.apply import Rollback
from ..tensors import _device
from ..tensors.bits import bits
from ..tensors.hashing import StateDigest, state_digest
from ..tensors.state import State


def follow(mirror: State | None, base: Mapping[str, torch.Tensor] | None, new: Mapping[str, torch.Tensor],
           base_digest: StateDigest | None) -> tuple[State, StateDigest, Rollback]:
    """Bring `mirror` (the host copy of `base`) to `new` and return it with `new`'s digest.

    Copies to the host only the changed elements (positions and values; the whole of `new` when there
    is no mirror yet) and rehashes only the tensors that changed. `mirror` is written in place: the
    returned `Rollback` undoes that if the version is not committed after all.
    """
    rollback = Rollback()
    if mirror is None or base is None or base_digest is None:
        mirror = {name: _device.to_host(t) for name, t in new.items()}
        return mirror, state_digest(mirror), rollback
    changed = []
    for name in sorted(new):
        positions = _device.changed_positions(base[name], new[name])  # computed on the device
        if positions.numel():
            values = new[name].detach().reshape(-1)[positions.to(new[name].device)]
            rollback.write(mirror[name], _device.to_host(positions).numpy(), bits(_device.to_host(values)))
            changed.append(name)
    return mirror, base_digest.updated(mirror, changed), rollback
