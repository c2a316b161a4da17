"""Random graphs, before and after the backward that frees them, through both walkers.

Each graph is a random sequence of ops drawn from ``OPS``: indexing with int tensors and bool
masks (``IndexBackward0`` saves a list of optional tensors), ``index_put`` and item assignment,
the ``_unsafe_index*`` ops, ``cat``/``stack`` of lists, views, in-place ops (on views too:
``CopySlices``), reductions that save indices, and custom Functions. Every graph must trace,
``make_dot`` and round-trip through JSON with the compiled and the pure-Python walker, before
and after ``backward()``, and what gradscope records is checked against what torch itself
says, read independently off the autograd nodes: which nodes there are, which saved attributes
hold which tensors before backward, and which ones backward freed (reading them raises).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from conftest import graph_counts, reference_walk

import gradscope as gs
from gradscope.graph import walk as _walk

_ORIGINAL = _walk.CWALK
N_GRAPHS = 60


# ---------------------------------------------------------------------- custom Functions
class SaveSome(torch.autograd.Function):
    """Saves its input, a None and a weight; keeps a tensor and a number on ctx."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, None, w)
        ctx.scale = 2.0
        ctx.kept = w.detach() * 1  # a tensor on ctx: backward does not free it
        return x * w.sum() * 2

    @staticmethod
    def backward(ctx, g):
        x, _, w = ctx.saved_tensors
        return g * w.sum() * 2, (g * x).sum().expand_as(w) * 2


class SaveList(torch.autograd.Function):
    """Saves a variable number of tensors (one per input)."""

    @staticmethod
    def forward(ctx, *xs):
        ctx.save_for_backward(*xs)
        return sum(x.sum() for x in xs) * torch.ones(3)

    @staticmethod
    def backward(ctx, g):
        return tuple(g.sum() * torch.ones_like(x) for x in ctx.saved_tensors)


# ---------------------------------------------------------------------- the ops
Pool = list[torch.Tensor]
Op = Callable[[random.Random, Pool], "torch.Tensor | None"]


def _pick(rng: random.Random, pool: Pool, *, min_dim: int = 0, min_rows: int = 0):
    fit = [t for t in pool if t.dim() >= min_dim and (t.dim() == 0 or t.shape[0] >= min_rows)]
    fit = [t for t in fit if t.numel() > 0]
    return rng.choice(fit) if fit else None


def _rows(rng: random.Random, t: torch.Tensor, k: int | None = None) -> torch.Tensor:
    k = k or rng.randint(1, 5)
    return torch.tensor([rng.randrange(t.shape[0]) for _ in range(k)])


def op_index_int(rng, pool):
    t = _pick(rng, pool, min_dim=1, min_rows=1)
    return None if t is None else t[_rows(rng, t)]


def op_index_second_dim(rng, pool):  # indices (None, idx): a list with an optional entry
    t = _pick(rng, pool, min_dim=2)
    if t is None or t.shape[1] == 0:
        return None
    return t[:, torch.tensor([rng.randrange(t.shape[1]) for _ in range(2)])]


def op_index_two_dims(rng, pool):
    t = _pick(rng, pool, min_dim=2, min_rows=1)
    if t is None or t.shape[1] == 0:
        return None
    k = rng.randint(1, 4)
    cols = torch.tensor([rng.randrange(t.shape[1]) for _ in range(k)])
    return t[_rows(rng, t, k), cols]


def op_index_mask(rng, pool):
    t = _pick(rng, pool, min_dim=1)
    if t is None:
        return None
    out = t[t.detach() > -0.5]
    return out if out.numel() else None


def op_index_put(rng, pool):
    t, v = _pick(rng, pool, min_dim=1, min_rows=1), _pick(rng, pool)
    if t is None or v is None:
        return None
    return t.index_put((_rows(rng, t),), v.sum() * 0.5, accumulate=rng.random() < 0.5)


def op_index_put_mask(rng, pool):
    t, v = _pick(rng, pool, min_dim=1), _pick(rng, pool)
    if t is None or v is None:
        return None
    return t.index_put((t.detach() > 0,), v.mean())


def op_setitem(rng, pool):  # in place on a copy: IndexPutBackward0 through __setitem__
    t, v = _pick(rng, pool, min_dim=1, min_rows=1), _pick(rng, pool)
    if t is None or v is None:
        return None
    out = t * 1
    out[_rows(rng, t)] = v.sum()
    return out


def op_unsafe_index(rng, pool):
    t = _pick(rng, pool, min_dim=1, min_rows=1)
    return None if t is None else torch.ops.aten._unsafe_index(t, [_rows(rng, t)])


def op_unsafe_index_put(rng, pool):
    t, v = _pick(rng, pool, min_dim=1, min_rows=1), _pick(rng, pool)
    if t is None or v is None:
        return None
    idx = _rows(rng, t)
    values = v.sum() * torch.ones((len(idx), *t.shape[1:]))
    return torch.ops.aten._unsafe_index_put(t, [idx], values, rng.random() < 0.5)


def op_unsafe_masked_index(rng, pool):
    t = _pick(rng, pool, min_dim=2, min_rows=1)
    if t is None:
        return None
    idx = _rows(rng, t)
    mask = torch.tensor([rng.random() < 0.6 for _ in idx]).view(-1, 1)
    return torch.ops.aten._unsafe_masked_index(t, mask, [idx, None], 0.0)


def op_cat(rng, pool):
    parts = [t.flatten() for t in rng.sample(pool, min(len(pool), rng.randint(1, 3)))]
    return torch.cat(parts)


def op_stack(rng, pool):
    parts = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
    k = min(t.numel() for t in parts)
    return None if k == 0 else torch.stack([t.flatten()[:k] for t in parts])


def op_view(rng, pool):
    t = _pick(rng, pool)
    if t is None:
        return None
    choice = rng.randrange(5)
    if choice == 0:
        return t.reshape(-1)
    if choice == 1:
        return t.unsqueeze(0)
    if choice == 2 and t.dim() >= 2:
        return t.transpose(0, 1)
    if choice == 3 and t.dim() >= 1 and t.shape[0] > 1:
        return t[1:]
    return t.view(t.shape).expand(2, *t.shape)


def op_inplace(rng, pool):
    t = _pick(rng, pool)
    if t is None:
        return None
    out = t * 1.5
    if rng.random() < 0.5:
        out.mul_(out.detach().sign() + 2)
    else:
        out.exp_()  # ExpBackward0 saves its result: the tensor itself
    return out


def op_inplace_view(rng, pool):  # in place on a view: CopySlices
    t = _pick(rng, pool, min_dim=1, min_rows=2)
    if t is None:
        return None
    out = t * 1.0
    out[:1].mul_(out[1:2].detach() + 3)
    return out


def op_unary(rng, pool):
    t = _pick(rng, pool)
    if t is None:
        return None
    return rng.choice([torch.sin, torch.tanh, torch.sigmoid, torch.exp, lambda x: x.pow(2)])(t)


def op_binary(rng, pool):
    a, b = _pick(rng, pool), _pick(rng, pool)
    if a is None or b is None:
        return None
    return a * b.mean() + b.sum()


def op_matmul(rng, pool):
    t = _pick(rng, pool, min_dim=2)
    return None if t is None else t @ t.transpose(0, 1)


def op_reduce_indices(rng, pool):  # MaxBackward0, SortBackward0...: a saved index tensor
    t = _pick(rng, pool, min_dim=1, min_rows=1)
    if t is None:
        return None
    if rng.random() < 0.5:
        return t.max(dim=0).values
    return t.sort(dim=0).values


def op_gather(rng, pool):
    t = _pick(rng, pool, min_dim=1, min_rows=1)
    return None if t is None else t.index_select(0, _rows(rng, t))


def op_custom(rng, pool):
    x, w = _pick(rng, pool), _pick(rng, pool)
    return None if x is None or w is None else SaveSome.apply(x, w)


def op_custom_list(rng, pool):
    parts = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
    return SaveList.apply(*parts)


OPS: list[Op] = [
    op_index_int, op_index_second_dim, op_index_two_dims, op_index_mask, op_index_put,
    op_index_put_mask, op_setitem, op_unsafe_index, op_unsafe_index_put, op_unsafe_masked_index,
    op_cat, op_stack, op_view, op_inplace, op_inplace_view, op_unary, op_binary, op_matmul,
    op_reduce_indices, op_gather, op_custom, op_custom_list,
]


def random_graph(seed: int) -> tuple[list[torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
    """(outputs, the loss over all of them, named leaves) of a random program."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    leaves = {
        f"x{i}": torch.randn(*rng.choice([(4, 3), (5,), (3, 3), (6, 2)]), requires_grad=True)
        for i in range(rng.randint(1, 3))
    }
    pool: Pool = list(leaves.values())
    for _ in range(rng.randint(4, 10)):
        out = rng.choice(OPS)(rng, pool)
        if out is not None:
            pool.append(out)
    made = pool[len(leaves):] or [pool[0] * 1]
    outputs = made[-rng.randint(1, min(3, len(made))):]
    loss = sum(o.sum() for o in made)  # every op feeds the loss: backward frees them all
    return outputs, loss, leaves


# ---------------------------------------------------------------------- ground truth
def torch_saved(fn) -> tuple[dict[str, int], set[str]]:
    """What torch says a node saved, read directly: ``{name: tensors held}`` for the saved
    attributes that hold tensors, and the names whose reading raises (freed by backward)."""
    held: dict[str, int] = {}
    freed: set[str] = set()
    if isinstance(fn, torch.autograd.function.BackwardCFunction):
        try:
            tensors = [t for t in fn.saved_tensors if t is not None]
        except RuntimeError:
            freed.add("saved_tensors")
        else:
            if tensors:
                held["saved_tensors"] = len(tensors)
        ctx = [k for k, v in vars(fn).items() if isinstance(v, torch.Tensor) and k[0] != "_"]
        held.update({f"ctx.{k}": 1 for k in ctx})
        return held, freed
    for attr in dir(fn):
        if not attr.startswith("_saved_"):
            continue
        name = attr[len("_saved_"):]
        try:
            val = getattr(fn, attr)
        except RuntimeError:
            freed.add(name)
            continue
        if isinstance(val, torch.Tensor):
            held[name] = 1
        elif isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val):
            held[name] = sum(isinstance(v, torch.Tensor) for v in val)
    return held, freed


def recorded_saved(node: gs.Node) -> tuple[dict[str, int], set[str]]:
    """The same two figures read off a gradscope node (``indices[1]`` counts for indices)."""
    held: Counter = Counter()
    freed: set[str] = set()
    for s in node.saved:
        base = s.name.partition("[")[0]
        if s.freed:
            freed.add(base)
        else:
            held[base] += 1
    return dict(held), freed


def reference_bytes(roots: list[torch.Tensor]) -> int:
    """Bytes of every distinct storage the graph's saved tensors hold, read off torch."""
    storages: dict[int, int] = {}
    seen, stack = set(), [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if isinstance(fn, torch.autograd.function.BackwardCFunction):
            try:
                vals = list(fn.saved_tensors)
            except RuntimeError:
                vals = []
            vals += [v for k, v in vars(fn).items() if k[0] != "_"]
        else:
            vals = []
            for attr in dir(fn):
                if attr.startswith("_saved_"):
                    try:
                        v = getattr(fn, attr)
                    except RuntimeError:
                        continue
                    vals.extend(v if isinstance(v, (list, tuple)) else [v])
        for v in vals:
            if isinstance(v, torch.Tensor):
                st = v.untyped_storage()
                storages[st.data_ptr() or id(st)] = st.nbytes()
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return sum(storages.values())


def check_graph(outputs, leaves, *, after_backward: bool) -> gs.Graph:
    """Trace, check against torch, make_dot and round-trip; returns the graph."""
    graph, ids = _walk.trace_with_ids(outputs, leaves)
    assert graph_counts(graph) == reference_walk(outputs)
    for fn, nid in ids.items():
        held, freed = torch_saved(fn)
        got_held, got_freed = recorded_saved(graph.node(nid))
        assert (got_held, got_freed) == (held, freed), graph.node(nid).name
        if after_backward:  # everything backward could free is freed
            assert not {k for k in held if not k.startswith("ctx.")}, graph.node(nid).name
    if not after_backward:
        assert not any(s.freed for n in graph.nodes for s in n.saved)
    del ids
    assert graph.memory().total == reference_bytes(outputs)
    assert gs.Graph.from_json(graph.to_json()) == graph
    graph.to_dot(saved=True, attrs=True)
    src = gs.make_dot(outputs, params=leaves, show_attrs=True, show_saved=True).source
    assert all(n.name in src for n in graph.backward_nodes)
    assert src.count("(freed)") == sum(s.freed for n in graph.nodes for s in n.saved)
    return graph


def test_the_ops_cover_list_saving_nodes():
    """The fuzz really draws the nodes that save lists of optional tensors."""
    names: Counter = Counter()
    for seed in range(N_GRAPHS):
        outputs, _, _ = random_graph(seed)
        names.update(reference_walk(outputs)[0])
    for name in ("IndexBackward0", "IndexPutBackward0", "UnsafeIndexBackward0",
                 "UnsafeIndexPutBackward0", "UnsafeMaskedIndexBackward0", "CopySlices",
                 "SaveSomeBackward", "SaveListBackward", "CatBackward0", "StackBackward0"):
        assert names[name] > 0, name


@pytest.mark.parametrize("seed", range(N_GRAPHS))
def test_random_graph_before_and_after_backward(walker, seed):
    outputs, loss, leaves = random_graph(seed)
    before = check_graph(outputs, leaves, after_backward=False)
    loss.backward()
    after = check_graph(outputs, leaves, after_backward=True)
    # the same nodes and edges; saved tensors freed in place of held ones
    assert [(n.id, n.name, n.kind) for n in after.nodes] == [
        (n.id, n.name, n.kind) for n in before.nodes
    ]
    assert after.edges == before.edges
    assert after.memory().total == reference_bytes(outputs)


@pytest.mark.skipif(_ORIGINAL is None, reason="compiled walk off")
@pytest.mark.parametrize("seed", range(0, N_GRAPHS, 3))
def test_both_walkers_agree_on_freed_graphs(monkeypatch, seed):
    outputs, loss, leaves = random_graph(seed)
    loss.backward()
    fast = gs.trace(outputs, leaves)
    monkeypatch.setattr(_walk, "CWALK", None)
    slow = gs.trace(outputs, leaves)
    assert fast == slow and fast.to_json() == slow.to_json()


@pytest.mark.parametrize("make", [
    lambda x: (x * 2)[torch.tensor([0, 2, 2])],
    lambda x: (x * 2)[x.detach() > 0],
    lambda x: (x * 1).index_put((torch.tensor([1, 3]),), torch.ones(2, 3)),
    lambda x: (x * 1)[:, torch.tensor([1, 2])],
])
def test_issue_examples_after_backward(walker, make):
    """The issue's cases: after ``y.sum().backward()``, trace and make_dot mark the saved list
    freed instead of raising torch's "backward through the graph a second time"."""
    x = torch.randn(5, 3, requires_grad=True)
    y = make(x)
    y.sum().backward()
    g = gs.trace(y)
    index = next(n for n in g.nodes if n.name.startswith("Index"))
    assert [(s.name, s.freed, s.nbytes) for s in index.saved] == [("indices", True, 0)]
    dot = g.to_dot(attrs=True)
    assert "indices\\n freed" in dot and "[freed]" in dot
    src = gs.make_dot(y, show_attrs=True, show_saved=True).source
    assert "indices\n (freed)" in src


@pytest.mark.skipif(_ORIGINAL is None, reason="compiled walk off")
def test_compiled_fallbacks_leak_nothing_and_propagate_errors():
    """The compiled walk's new fallbacks (a freed saved list; a shape that is not a list of
    ints) hand over to Python without leaking references, and errors raised there surface."""
    import gc
    import sys
    import warnings

    x = torch.randn(5, 3, requires_grad=True)
    y = (x * 2)[torch.tensor([0, 2])]
    y.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)],
                                        requires_grad=True)  # strided: no .shape
    z = (nt * nt).sin()
    roots = (y, z)
    gs.trace(roots)  # warm the caches
    gc.collect()
    counts = [sys.getrefcount(t.grad_fn) for t in roots]
    before = len(gc.get_objects())
    for _ in range(20):
        gs.trace(roots)
    gc.collect()
    assert [sys.getrefcount(t.grad_fn) for t in roots] == counts
    assert len(gc.get_objects()) - before < 50

    def boom(*args):
        raise ValueError("callback failed")

    assert _walk.CWALK is _ORIGINAL  # the walker's walk below is the compiled one
    for method, root in (("read_saved_seq", y), ("shape_of", z)):
        w = _walk._Walker({}, True, False)
        setattr(w, method, boom)  # the compiled walk is given the walker's methods
        with pytest.raises(ValueError, match="callback failed"):
            w.walk(root.grad_fn)
