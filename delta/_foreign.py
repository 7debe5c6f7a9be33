"""Delta files written by other software, read into our `raw` layout so they apply like ours.

Two layouts, neither carrying state hashes (the reader's hash after applying is its own):
- TRL's blog layout: `{name}.indices` (int32 flat positions) + `{name}.values`, no metadata.
- TRL's delta-weight-sync branches (`weight_diff.PatchMetadata`): metadata `format` =
  `sparse_weight_patch`, `version` = `1`, `sparse`, `model_version`, `encoding`; a sparse patch
  holds `{name}.idx` + `{name}.val` (bf16), where `idx` is int32 positions (`raw`), or uint16 /
  uint32 gaps `idx[k] - idx[k-1] - 1` with idx[-1] = -1 (`gap_delta`), or nvCOMP Cascaded bytes
  (`nvcomp_cascaded`, which needs nvCOMP on a GPU and is refused here). `sparse` = False marks a
  full snapshot, which is a state to load, not a delta.
"""

from __future__ import annotations

import torch

from .bits import DTYPE_NAMES
from .errors import DeltaFormatError
from .format import DeltaHeader, TensorEntry

PATCH_FORMAT = "sparse_weight_patch"
_GAP_DTYPES = (torch.uint16, torch.uint32)


def is_blog_layout(meta: dict, blobs: dict[str, torch.Tensor]) -> bool:
    """A file with no metadata whose tensors are all `{name}.indices` / `{name}.values`."""
    return meta.get("format") is None and bool(blobs) and all(k.endswith((".indices", ".values")) for k in blobs)


def blog_layout(blobs: dict[str, torch.Tensor], path: str | None) -> DeltaHeader:
    """Header for a TRL blog-layout file: every `{name}.indices` needs its `{name}.values`, and vice versa."""
    names = sorted({k.rsplit(".", 1)[0] for k in blobs})
    entries = []
    for name in names:
        idx, val = blobs.get(f"{name}.indices"), blobs.get(f"{name}.values")
        if idx is None or val is None:
            raise DeltaFormatError(f"has {'indices' if val is None else 'values'} but no "
                                   f"{'values' if val is None else 'indices'}", path=path, tensor=name)
        entries.append(TensorEntry(name=name, dtype=DTYPE_NAMES.get(val.dtype, str(val.dtype)), shape=(),
                                   form="indices", changed=idx.numel()))
    return _header(entries, None)


def sparse_weight_patch(meta: dict, blobs: dict[str, torch.Tensor], path: str | None
                        ) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """A TRL `sparse_weight_patch` file as a foreign `raw` delta: (header, blobs in the blog layout).

    Raises:
        DeltaFormatError: another patch version, a full snapshot, nvCOMP indices, or malformed tensors.
    """
    if meta.get("version") != "1":
        raise DeltaFormatError(f"sparse_weight_patch version {meta.get('version')!r} is not supported (supports '1')",
                               path=path)
    if meta.get("sparse") != "True":
        raise DeltaFormatError("this sparse_weight_patch is a full snapshot (sparse=False), not a delta: load it as a "
                               "state (delta.load_state, or as OLD on the command line)", path=path)
    encoding = meta.get("encoding")
    if encoding == "nvcomp_cascaded":
        raise DeltaFormatError("indices coded with nvCOMP Cascaded need nvCOMP on a GPU to decode; publish with "
                               "encoding 'gap_delta' or 'raw'", path=path)
    if encoding not in ("raw", "gap_delta"):
        raise DeltaFormatError(f"unknown sparse_weight_patch encoding {encoding!r} (expected 'raw' or 'gap_delta')",
                               path=path)
    names = sorted({k.rsplit(".", 1)[0] for k in blobs})
    out: dict[str, torch.Tensor] = {}
    for name in names:
        idx, val = blobs.get(f"{name}.idx"), blobs.get(f"{name}.val")
        if idx is None or val is None or len(blobs) != 2 * len(names):
            raise DeltaFormatError("every tensor needs exactly `{name}.idx` and `{name}.val`", path=path, tensor=name)
        if idx.dim() != 1 or val.dim() != 1 or idx.numel() != val.numel():
            raise DeltaFormatError(f"idx {tuple(idx.shape)} and val {tuple(val.shape)} must be 1-D and of one length",
                                   path=path, tensor=name)
        if encoding == "raw" and idx.dtype != torch.int32:
            raise DeltaFormatError(f"encoding 'raw' stores int32 positions, not {idx.dtype}", path=path, tensor=name)
        if encoding == "gap_delta":
            if idx.dtype not in _GAP_DTYPES:
                raise DeltaFormatError(f"encoding 'gap_delta' stores uint16 or uint32 gaps, not {idx.dtype}",
                                       path=path, tensor=name)
            idx = torch.cumsum(idx.to(torch.int64) + 1, 0) - 1
        out[f"{name}.indices"], out[f"{name}.values"] = idx.to(torch.int64), val
    version = meta.get("model_version", "")
    header = blog_layout(out, path)
    return _header(list(header.tensors), int(version) if version.lstrip("-").isdigit() else None), out


def _header(entries: list[TensorEntry], version: int | None) -> DeltaHeader:
    changed = sum(e.changed for e in entries)
    return DeltaHeader(codec="raw", version=version, base_version=None, changed=changed, total=0, base_hash="",
                       target_hash="", tensors=tuple(entries), foreign=True)
