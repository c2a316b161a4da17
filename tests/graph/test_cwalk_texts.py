"""The compiled walk keeps ``str()`` of int and int-tuple attribute values for one walk
(``cached_str`` in _cwalk.c): values equal as numbers but printed otherwise (``2``, ``2.0``,
``True``) must each keep their own text, as torch's own attribute reads print them."""

from __future__ import annotations

import pytest
import torch

import gradscope as gs
from gradscope.graph import walk as _capture


def _walk_nodes(y: torch.Tensor) -> list:
    out, seen, stack = [], set(), [y.grad_fn]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        stack.extend(n for n, _ in reversed(fn.next_functions) if n is not None)
    return out


def _truth(fns: list) -> tuple[list[dict[str, str]], list[set[str]]]:
    """Each node's non-tensor saved attributes, as str() of torch's own reads, and the names
    of its saved tensor slots (an optional one left unsaved is an attribute too: not compared)."""
    rows, tensors = [], []
    for fn in fns:
        names = sorted(a for a in dir(fn) if a.startswith("_saved_"))
        raw = {a[len("_raw"):] for a in dir(fn) if a.startswith("_raw_saved_")}
        rows.append({a[len("_saved_"):]: str(getattr(fn, a)) for a in names if a not in raw})
        tensors.append({a[len("_saved_"):] for a in raw})
    return rows, tensors


@pytest.mark.parametrize("pure", [False, True])
def test_equal_numbers_keep_their_own_text(monkeypatch, pure):
    if pure:
        monkeypatch.setattr(_capture, "CWALK", None)
    elif _capture.CWALK is None:
        pytest.skip("compiled walk not built")
    x = torch.randn(3, 4, requires_grad=True)
    # the same number as an int, a float and a bool scalar; sizes as int tuples, repeated
    y = (x * 2) * 2.0
    y = y.pow(2) + y.pow(2.0) + (x * True)
    y = y.sum(1, keepdim=True).expand(3, 4).sum() + x.reshape(4, 3).sum()
    g = gs.trace(y)
    fns = _walk_nodes(y)
    ops = [n for n in g.nodes if n.kind in ("op", "accumulate", "custom")]
    assert [n.name for n in ops] == [type(f).__name__ for f in fns]
    truth, tensors = _truth(fns)
    got = [{k: v for k, v in n.attrs.items() if k not in t} for n, t in zip(ops, tensors)]
    assert got == truth
    texts = {v for row in truth for v in row.values()}
    assert {"2", "2.0", "True"} <= texts  # the case the cache must tell apart is there
