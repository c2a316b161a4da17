"""gs.scopes: module paths against named_modules(), and against which nodes each forward really
created (ground truth: the nodes reachable from a module's output that were not reachable from
its input, computed by a plain walk that knows nothing of gradscope)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import SAMPLES
from torch import nn
from torch.nn.modules import module as torch_module

import gradscope as gs
from gradscope.errors import ScopesError
from gradscope.graph.paths import strip_calls


def reachable(*tensors: torch.Tensor) -> set:
    """Every backward node reachable from ``tensors`` (the reference walk)."""
    seen: set = set()
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack.extend(n for n, _ in fn.next_functions if n is not None)
    return seen


def op_ids_by_module(graph: gs.Graph) -> dict[str | None, set[str]]:
    out: dict[str | None, set[str]] = {}
    for n in graph.nodes:
        if n.kind in ("op", "custom"):
            out.setdefault(n.module, set()).add(n.id)
    return out


def global_hook_counts() -> tuple[int, int, int]:
    return (
        len(torch_module._global_forward_pre_hooks),
        len(torch_module._global_forward_hooks),
        len(torch_module._global_forward_hooks_always_called),
    )


def assert_no_hooks(model: nn.Module) -> None:
    for name, m in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks", "_forward_hooks_always_called"):
            assert not getattr(m, attr), f"{name or 'root'} still has {attr}"


@pytest.mark.parametrize("sample", ["mlp.py", "cnn.py", "transformer.py"])
def test_sample_paths_are_named_modules(sample: str) -> None:
    before = global_hook_counts()
    fwd = gs.load_model_file(SAMPLES / sample).forward()
    graph = gs.trace(fwd.outputs, model=fwd.model)
    names = {n for n, _ in fwd.model.named_modules()}
    ops = [n for n in graph.nodes if n.kind in ("op", "custom")]
    assert ops and all(n.module is not None for n in ops), "an op inside the forward has no module"
    assert {strip_calls(n.module) for n in ops} <= names
    for n in graph.nodes:  # a parameter's AccumulateGrad belongs to the module owning it
        if n.kind == "accumulate":
            leaf = graph.node(graph.children()[n.id][0].dst)
            assert n.module == leaf.name.rpartition(".")[0]
    assert_no_hooks(fwd.model)
    assert global_hook_counts() == before


def test_class_chains_follow_named_modules() -> None:
    from gradscope._torch.stamps import MODULE_CLASSES_KEY, MODULE_KEY
    from gradscope.graph.paths import levels

    fwd = gs.load_model_file(SAMPLES / "transformer.py").forward()
    modules = dict(fwd.model.named_modules())
    stack, seen, checked = [fwd.outputs.grad_fn], set(), 0
    while stack:  # the live autograd graph, read directly
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack.extend(n for n, _ in fn.next_functions if n is not None)
        path = fn.metadata.get(MODULE_KEY)
        if not path:
            continue
        lv = levels(path)
        want = [type(fwd.model).__name__]  # the model's own class first, then one per level
        want += [type(modules[".".join(lv[: d + 1])]).__name__ for d in range(len(lv))]
        assert fn.metadata[MODULE_CLASSES_KEY].split("/") == want
        checked += 1
    assert checked > 100


def test_each_layer_gets_exactly_the_nodes_its_forward_created() -> None:
    model = nn.Sequential(
        nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2)
    )
    x = torch.randn(5, 4, requires_grad=True)
    with gs.scopes(model):
        out = model(x)
    # Reference: re-run layer by layer (same ops);
    # layer i created reachable(h_i) - reachable(h_{i-1}).
    h, expected = x, {}
    for i, layer in enumerate(model):
        nxt = layer(h)
        expected[str(i)] = sorted(type(f).__name__ for f in reachable(nxt) - reachable(h))
        h = nxt
    graph = gs.trace(out, model=model)
    got: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.kind == "op":
            got.setdefault(n.module, []).append(n.name)
    assert {k: sorted(v) for k, v in got.items()} == {
        k: [name for name in v if name != "AccumulateGrad"] for k, v in expected.items()
    }
    assert "TBackward0" in got["0"]  # the interior node of F.linear, not only its output node


class Looped(nn.Module):
    """One block applied three times (shared weights), between root-level ops."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2.0
        for _ in range(3):
            x = self.block(x) + 1.0
        return self.head(x)


def test_repeated_calls_are_kept_apart() -> None:
    model = Looped()
    x = torch.randn(2, 4, requires_grad=True)
    with gs.scopes(model):
        out = model(x)
    graph = gs.trace(out, model=model)
    by_module = op_ids_by_module(graph)
    assert set(by_module) == {
        "", "block", "block.0", "block.1", "block#1", "block#1.0", "block#1.1",
        "block#2", "block#2.0", "block#2.1", "head",
    } - {"block", "block#1", "block#2"}  # Sequential itself creates no node
    names = {
        n.module: n.name
        for n in graph.nodes
        if n.kind == "op" and n.module in ("block.1", "block#2.1")
    }
    assert names == {"block.1": "ReluBackward0", "block#2.1": "ReluBackward0"}
    # the root's own ops (x * 2, the + 1.0 after each call) get "", the block's weights block.0
    root_ops = sorted(graph.node(i).name for i in by_module[""])
    assert root_ops == ["AddBackward0"] * 3 + ["MulBackward0"]
    acc = {n.module for n in graph.nodes if n.kind == "accumulate"}
    assert acc == {"block.0", "head", None}  # None: the input x is no module's parameter


def test_ops_outside_the_model_get_no_module() -> None:
    model = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    with gs.scopes(model):
        y = model(x.exp()).sum()
    graph = gs.trace(y, model=model)
    mods = {n.name: n.module for n in graph.nodes if n.kind == "op"}
    assert mods["ExpBackward0"] is None and mods["SumBackward0"] is None
    assert mods["AddmmBackward0"] == "" and mods["TBackward0"] == ""


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")


def test_hooks_removed_when_forward_raises() -> None:
    model = nn.Sequential(nn.Linear(2, 2), Boom())
    before = global_hook_counts()
    with pytest.raises(RuntimeError, match="boom"), gs.scopes(model):
        model(torch.randn(1, 2))
    assert global_hook_counts() == before
    assert_no_hooks(model)
    with gs.scopes(model[0]):  # usable again afterwards
        out = model[0](torch.randn(1, 2))
    assert {n.module for n in gs.trace(out, model=model[0]).nodes if n.kind == "op"} == {""}


def test_bad_uses_say_what_to_do() -> None:
    with pytest.raises(ScopesError, match="nn.Module"), gs.scopes(lambda x: x):  # type: ignore[arg-type]
        pass
    model = nn.Linear(2, 2)
    before = global_hook_counts()
    with pytest.raises(ScopesError, match="already open"), gs.scopes(model), gs.scopes(model):
        pass
    assert global_hook_counts() == before
    assert_no_hooks(model)


def test_gpt2_paths_match_named_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, attn_implementation="eager"
    )
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(0, 64, (1, 8))
    before = global_hook_counts()
    with gs.scopes(model):
        out = model(tokens, labels=tokens)
    graph = gs.trace(out.loss, model=model)
    names = {n for n, _ in model.named_modules()}
    ops = [n for n in graph.nodes if n.kind in ("op", "custom")]
    assert all(n.module is not None for n in ops)
    seen = {strip_calls(n.module) for n in ops}
    assert seen <= names
    for block in ("transformer.h.0.attn", "transformer.h.1.mlp.c_fc", "transformer.ln_f",
                  "lm_head"):
        assert block in seen
    assert global_hook_counts() == before
    assert_no_hooks(model)
    assert os.environ["HF_HUB_OFFLINE"] == "1"


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.extra = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Scaled()
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        h = h.sigmoid()  # the parent's own op, right after the block returns
        return self.head(h)


def test_ops_made_by_a_modules_forward_hooks_belong_to_it() -> None:
    model = _Outer()

    def hook(module, args, output):
        return module.extra(output.tanh()) * 2  # an op, a submodule, another op

    handle = model.block.register_forward_hook(hook)
    try:
        with gs.scopes(model):
            out = model(torch.randn(2, 3))
        hooks_before = dict(model.block._forward_hooks)
        g = gs.trace(out, model=model)
    finally:
        handle.remove()
    where = {n.name: n.module for n in g.nodes if n.kind == "op"}
    assert where["TanhBackward0"] == "block"  # made by the block's hook
    assert where["MulBackward0"] == "block"
    assert {n.module for n in g.nodes if n.name == "AddmmBackward0"} == {
        "block.lin", "block.extra", "head"}
    assert where["SigmoidBackward0"] == ""  # the parent's op after the call returned
    assert list(hooks_before) == [handle.id]  # the model's own hook dict: only the user's
    assert torch._C._len_torch_function_stack() == 0


def test_an_op_made_in_a_forward_hook_has_the_hooks_line() -> None:
    """A module's forward hook that changes its output (``out * 2``): under ``scopes`` and
    ``record_forward`` together, the op's node carries the hook's own line and the module."""
    import inspect

    import gradscope as gs

    def double(module, args, out):
        return out * 2  # the line the node must name

    lines, first = inspect.getsourcelines(double)
    hook_line = first + next(i for i, text in enumerate(lines) if "out * 2" in text)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    handle = model[0].register_forward_hook(double)
    try:
        for outer_scopes in (False, True):
            if outer_scopes:
                with gs.scopes(model), gs.record_forward():
                    y = model(torch.randn(2, 3))
            else:
                with gs.record_forward(), gs.scopes(model):
                    y = model(torch.randn(2, 3))
            loss = y.sum()
            with gs.record_backward(loss, model=model) as rec:
                loss.backward()
            (mul,) = [n for n in rec.graph.nodes if n.name == "MulBackward0"]
            assert f":{hook_line}: return out * 2" in mul.created_at
            assert mul.module == "0"
    finally:
        handle.remove()


def test_a_hooked_modules_output_is_not_kept_alive_by_the_block():
    """A module with a forward hook of its own (FSDP2 adds them to every sharded module):
    the hook mode ``scopes`` keeps until the module's call returns held that call's frame,
    and through it the module's output, until the block ended (step_memory counted a
    Llama's 250 MiB of logits live through the whole backward). Once the next torch call
    shows the module returned, the output is free to go."""
    import gc
    import weakref

    from gradscope.graph.scopes import scopes

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model.register_forward_hook(lambda module, args, out: None)
    with scopes(model):
        out = model(torch.randn(2, 4))
        ref = weakref.ref(out)
        loss = (out * 2.0).sum()  # a torch call after the module returned (saves no tensor)
        del out
        gc.collect()
        assert ref() is None
        loss.backward()
