"""Course: tensor storage, strides, offset and contiguity.

A 3x4 tensor is a view of a one-dimensional storage of 12 floats: element [i, j] lives at
storage_offset + i*stride[0] + j*stride[1]. Its transpose reads the *same* storage with the
strides swapped (so it is not contiguous); a slice starts at a non-zero offset; .contiguous()
copies into a new storage laid out row by row.

    python samples/course/storage_strides.py
"""

from __future__ import annotations

import torch
from rich.console import Console

import gradscope as gs


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    t = torch.arange(12.0).reshape(3, 4)
    views = {
        "t (3x4)": t,
        "t.T (transpose)": t.T,
        "t[1:, 2:] (slice)": t[1:, 2:],
        "t.T.contiguous() (copy)": t.T.contiguous(),
    }
    found = {}
    for label, v in views.items():
        e = gs.explain(v, t)
        found[label] = e
        shared = "shares t's storage" if e.shares_storage_with == [0] else "has its own storage"
        out.rule(label)
        out.print(f"stride {e.stride}, offset {e.storage_offset}, contiguous {e.is_contiguous}, "
                  f"{shared}")
        out.print(e)
    return found


if __name__ == "__main__":
    main()
