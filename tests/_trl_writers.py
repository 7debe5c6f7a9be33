"""Delta files laid out the way TRL's AsyncGRPO delta branches write them, for the foreign-file tests.

Written here from the layouts of TRL's published writers (huggingface/trl, `trl/experimental/async_grpo/`),
not with this project's writer: every file goes through `safetensors.torch.save`, as TRL's do.

- Earlier layout (`weight_diff.encode_sparse_patch` + `delta_engine.trainer_send_weights`, branch
  `delta-weight-sync`, commit a46bf262d): `{name}.indices` (int32) + `{name}.values` (bf16) for every
  tensor with a change, found by comparing bf16 values with `!=`; metadata `PatchMetadata` as strings:
  `format=sparse_weight_patch`, `version=1`, `model_version`, `prev_model_version`, `anchor_step`,
  `base_model_id`, `num_changed_params`, `total_changed_elements`, `total_elements`, `sparsity`,
  `checksum_sha256` (SHA-256 of every tensor's bytes of the whole new bf16 state, in name order) and
  `changed_params` (JSON list of names); no `sparse` key. A step where nothing changed holds one
  placeholder tensor `__empty_delta__` (int32 [0]). Its anchors: every tensor in full, metadata
  `format=anchor_checkpoint`, `version=1`, `model_version`, `base_model_id`, `checksum_sha256`.
- Middle layout (same branch, commits 592734f2a..9f2e55fb4, `DeltaWeightTransferEngine.upload`):
  `{name}.indices` / `{name}.values`, `PatchMetadata` with `sparse`, `changed_params`, no checksum;
  an anchor is the same metadata with `sparse=False` and the tensors in full.
- Later layout (branches `delta-weight-sync-v2`/`-v3`, commit 019ac7357 on, `delta_engine.encode_patch`):
  `{name}.idx` + `{name}.val` (bf16), `idx` int32 positions (`raw`) or gaps `idx[k] - idx[k-1] - 1`
  as uint16, uint32 when a gap does not fit (`gap_delta`); metadata `sparse`, `model_version`,
  `num_changed_params`, `total_changed_elements`, `total_elements`, `sparsity`, `encoding`; an anchor
  has `sparse=False` and the tensors in full (bf16).
"""

from __future__ import annotations

import hashlib
import json

import torch
from safetensors.torch import save


def bf16_checksum(state: dict[str, torch.Tensor]) -> str:
    """TRL's `compute_bf16_checksum`: SHA-256 over each tensor's bytes, names sorted, names not hashed."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(state[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _positions(prev: torch.Tensor, curr: torch.Tensor) -> torch.Tensor:
    """Changed flat positions as TRL finds them: bf16 values compared with `!=` (not bit patterns)."""
    return (curr != prev).reshape(-1).nonzero()[:, 0].to(torch.int32)


def earlier_patch(prev: dict, curr: dict, model_version: int, anchor_step: int = 0, base_model_id: str = "") -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    names, changed, total = [], 0, 0
    for name in sorted(curr):
        total += curr[name].numel()
        pos = _positions(prev[name], curr[name])
        if not pos.numel():
            continue
        names.append(name)
        changed += pos.numel()
        tensors[f"{name}.indices"] = pos
        tensors[f"{name}.values"] = curr[name].reshape(-1)[pos.long()]
    meta = {"format": "sparse_weight_patch", "version": "1", "model_version": str(model_version),
            "prev_model_version": str(model_version - 1), "anchor_step": str(anchor_step),
            "base_model_id": base_model_id, "num_changed_params": str(len(names)),
            "total_changed_elements": str(changed), "total_elements": str(total),
            "sparsity": str(1.0 - changed / max(total, 1)), "checksum_sha256": bf16_checksum(curr),
            "changed_params": json.dumps(names)}
    if not tensors:
        tensors["__empty_delta__"] = torch.zeros(1, dtype=torch.int32)
    return save(tensors, metadata=meta)


def earlier_anchor(curr: dict, model_version: int, base_model_id: str = "") -> bytes:
    meta = {"format": "anchor_checkpoint", "version": "1", "model_version": str(model_version),
            "base_model_id": base_model_id, "checksum_sha256": bf16_checksum(curr)}
    return save({k: v.to(torch.bfloat16).contiguous() for k, v in curr.items()}, metadata=meta)


def middle_patch(prev: dict | None, curr: dict, model_version: int) -> bytes:
    """`prev` None: an anchor (every tensor in full, sparse=False)."""
    tensors: dict[str, torch.Tensor] = {}
    names, changed, total = [], 0, 0
    for name in curr:
        total += curr[name].numel()
        names.append(name)
        if prev is None:
            tensors[name] = curr[name].to(torch.bfloat16).clone()
            changed += curr[name].numel()
        else:
            pos = (curr[name] != prev[name]).reshape(-1).nonzero()[:, 0].to(torch.int32)
            tensors[f"{name}.indices"] = pos
            tensors[f"{name}.values"] = curr[name].reshape(-1)[pos.long()]
            changed += pos.numel()
    meta = {"format": "sparse_weight_patch", "version": "1", "sparse": str(prev is not None),
            "model_version": str(model_version), "num_changed_params": str(len(names)),
            "total_changed_elements": str(changed), "total_elements": str(total),
            "sparsity": str(1.0 - changed / max(total, 1)), "changed_params": json.dumps(names)}
    return save(tensors, metadata=meta)


def later_patch(prev: dict | None, curr: dict, model_version: int, encoding: str = "gap_delta") -> bytes:
    """`prev` None: an anchor. `encoding`: 'raw' or 'gap_delta'."""
    tensors: dict[str, torch.Tensor] = {}
    changed, total = 0, 0
    for name in curr:
        total += curr[name].numel()
        if prev is None:
            tensors[name] = curr[name].detach().to(torch.bfloat16).contiguous().clone()
            changed += curr[name].numel()
            continue
        pos = (curr[name] != prev[name]).reshape(-1).nonzero()[:, 0].to(torch.int32)
        changed += pos.numel()
        tensors[f"{name}.val"] = curr[name].reshape(-1)[pos.long()].to(torch.bfloat16).contiguous()
        if encoding == "raw":
            tensors[f"{name}.idx"] = pos.contiguous()
        elif pos.numel() == 0:
            tensors[f"{name}.idx"] = pos.to(torch.uint16)
        else:
            p = pos.long()
            gaps = p - torch.cat([p.new_full((1,), -1), p[:-1]]) - 1
            tensors[f"{name}.idx"] = gaps.to(torch.uint16 if int(gaps.max()) <= 0xFFFF else torch.uint32).contiguous()
    meta = {"format": "sparse_weight_patch", "version": "1", "sparse": str(prev is not None),
            "model_version": str(model_version), "num_changed_params": str(len(curr)),
            "total_changed_elements": str(changed), "total_elements": str(total),
            "sparsity": str(1.0 - changed / max(total, 1)), "encoding": encoding}
    return save(tensors, metadata=meta)


def trl_states(seed: int = 0, steps: int = 2, mlp: int = 70_000) -> list[dict[str, torch.Tensor]]:
    """A small bf16 state (TRL streams bf16) and `steps` AdamW-like updates of it: one tensor that does not
    change, and one with a long unchanged run (with `mlp` > 66_536 elements a `gap_delta` gap needs 32 bits)."""
    g = torch.Generator().manual_seed(seed)
    state = {"model.embed.weight": (torch.randn(30, 40, generator=g) * 0.02).bfloat16(),
             "model.layers.0.mlp.weight": (torch.randn(mlp, generator=g) * 0.02).bfloat16(),
             "model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}
    out = [state]
    for _ in range(steps):
        prev = out[-1]
        new = {k: (v.float() + 2e-4 * torch.randn(v.shape, generator=g)).bfloat16() for k, v in prev.items()}
        new["model.norm.weight"] = prev["model.norm.weight"].clone()
        w, before = new["model.layers.0.mlp.weight"], prev["model.layers.0.mlp.weight"]
        w[6:mlp - 1000] = before[6:mlp - 1000]
        w[5] = before[5] + 1
        out.append(new)
    return out
