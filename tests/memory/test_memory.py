"""Memory held by autograd graphs: Graph.memory(), live accounting, the leak detector.

Ground truth comes from PyTorch itself: the storages behind the autograd nodes' ``_saved_*``
attributes (``untyped_storage().nbytes()``), the gradients and parameters of runs without
gradscope, and autograd's own in-place check.
"""

from __future__ import annotations

import importlib.util
import re
import warnings

import pytest
import torch
from conftest import SAMPLES, run_cli
from rich.console import Console
from torch.nn.modules import module as nn_module

import gradscope as gs
from gradscope.graph.graph import (
    Edge,
    Graph,
    Node,
    SavedTensor,
    TensorInfo,
)
from gradscope.graph.paths import strip_calls
from gradscope.memory import saved as _memory

HAS_STORAGE_NBYTES = "storage_nbytes" in SavedTensor.__dataclass_fields__


def load_sample(name: str):
    spec = importlib.util.spec_from_file_location(f"memory_sample_{name}", SAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------- ground truth
def reference_storages(roots) -> dict:
    """Every storage held by a saved tensor of the graph behind ``roots``, read directly from
    the autograd nodes (``_saved_*``, custom Functions' ``saved_tensors`` and tensors on ctx),
    mapped to ``untyped_storage().nbytes()``."""
    roots = [roots] if isinstance(roots, torch.Tensor) else roots
    storages: dict = {}

    def add(t):
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            storages[(t.device.type, st.data_ptr(), st.nbytes())] = st.nbytes()
        elif isinstance(t, (list, tuple)):
            for item in t:
                add(item)

    seen, stack = set(), [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if isinstance(fn, torch.autograd.function.BackwardCFunction):
            add(tuple(fn.saved_tensors))
            add(tuple(v for v in vars(fn).values() if isinstance(v, torch.Tensor)))
        else:
            for attr in dir(fn):
                if attr.startswith("_saved_"):
                    try:
                        add(getattr(fn, attr))
                    except RuntimeError:  # freed by backward: holds nothing
                        pass
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return storages


def forward(name: str):
    """(model, output) of a sample's forward, run under gs.scopes."""
    mf = gs.load_model_file(SAMPLES / f"{name}.py")
    fwd = mf.forward()
    return fwd.model, fwd.outputs


# ---------------------------------------------------------------------- Graph.memory()
@pytest.mark.parametrize("name", ["mlp", "cnn", "custom_function", "checkpointing"])
def test_graph_memory_equals_storage_reference(name):
    model, out = forward(name)
    rep = gs.trace(out, model=model).memory()
    ref = reference_storages(out)
    assert rep.total == sum(ref.values()) > 0
    assert len(rep.storages) == len(ref)
    assert rep.total == rep.activation_bytes + rep.leaf_bytes + rep.output_bytes


@pytest.mark.xfail(
    not HAS_STORAGE_NBYTES,
    strict=True,
    reason="SavedTensor has no storage_nbytes yet: a saved slice counts as its view's bytes",
)
@pytest.mark.parametrize("name", ["slices", "transformer"])
def test_graph_memory_counts_whole_storages_behind_slices(name):
    if name == "slices":
        x = torch.randn(8, 6, requires_grad=True)
        a, b = (x * 3).chunk(2, dim=1)  # two views of one 192-byte storage
        out = (a.exp() * b).sum()
    else:
        _, out = forward(name)
    assert gs.trace(out).memory().total == sum(reference_storages(out).values())


def test_graph_memory_splits_leaves_outputs_activations():
    w = torch.randn(5, 3, requires_grad=True)  # leaf: mm saves it for the input's gradient
    x = torch.randn(4, 5, requires_grad=True)
    h = x @ w  # saves x and w (both leaves)
    y = h.tanh()  # saves its result y: the output
    loss = (y * h).sum()  # saves h (activation) and y again
    rep = gs.trace([loss, y]).memory()
    leaf = x.untyped_storage().nbytes() + w.untyped_storage().nbytes()
    assert rep.leaf_bytes == leaf
    assert rep.output_bytes == y.untyped_storage().nbytes()
    assert rep.activation_bytes == h.untyped_storage().nbytes()
    assert rep.total == sum(reference_storages(loss).values())


def test_shared_storage_counts_once_and_goes_to_its_first_saver():
    g = Graph(
        nodes=[
            Node("n0", "MulBackward0", "op", module="b", saved=[
                SavedTensor("self", [4], "float32", "cpu", 16, "s0"),
                SavedTensor("other", [4], "float32", "cpu", 16, "s1"),
            ]),
            Node("n1", "ExpBackward0", "op", module="a", saved=[
                SavedTensor("result", [4], "float32", "cpu", 16, "s0"),
            ]),
            Node("n2", "AccumulateGrad", "accumulate"),
            Node("n3", "w", "leaf", tensor=TensorInfo("w", [4], "float32", "cpu", "s1")),
            Node("n4", "PowBackward0", "op", module=None, saved=[
                SavedTensor("self", [2], "float32", "cpu", 0, None, freed=True),
                SavedTensor("exponent", [2], "float32", "cpu", 8, None),
            ]),
        ],
        edges=[Edge("n0", "n1", 0), Edge("n0", "n2", 1), Edge("n2", "n3", 0), Edge("n0", "n4", 2)],
        roots=["n0"],
    )
    rep = g.memory()
    # s0 is saved by n0 (module b) and by n1 (module a), which ran first: it belongs to a.
    assert rep.by_node == {"n1": 16, "n0": 16, "n4": 8}
    assert rep.by_module == {"a": 16, "b": 16, None: 8}
    assert (rep.total, rep.leaf_bytes, rep.activation_bytes, rep.freed) == (40, 16, 24, 1)
    assert rep.module_bytes(0) == {"": 32, None: 8}
    assert Graph.from_json(g.to_json()).memory() == rep


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_per_module_figures_add_up_to_the_total(name):
    model, out = forward(name)
    rep = gs.trace(out, model=model).memory()
    assert sum(rep.by_module.values()) == rep.total == sum(rep.by_node.values())
    assert sum(rep.module_bytes(1).values()) == rep.total
    names = {n for n, _ in model.named_modules()}
    paths = {p for p in rep.by_module if p is not None}
    assert paths and all(strip_calls(p) in names for p in paths)
    assert len(paths) > 3  # the bytes really are spread over modules


def test_freed_saved_tensors_hold_nothing():
    model, out = forward("mlp")
    loss = out.pow(2).mean()
    loss.backward()
    rep = gs.trace(loss, model=model).memory()
    assert rep.total == 0 == sum(reference_storages(loss).values())
    assert rep.freed > 0


def test_memory_renders_as_a_table():
    g = Graph(
        nodes=[
            Node("n0", "MulBackward0", "op", module="enc.0", saved=[
                SavedTensor("self", [256], "float32", "cpu", 1024, "s0"),
                SavedTensor("other", [512], "float32", "cpu", 2048, "s2"),  # the weight w
            ]),
            Node("n1", "ExpBackward0", "op", module="enc.1", saved=[
                SavedTensor("result", [768], "float32", "cpu", 3072, "s1"),
            ]),
            Node("n2", "AccumulateGrad", "accumulate", module="enc.0"),
            Node("n3", "w", "leaf", tensor=TensorInfo("w", [512], "float32", "cpu", "s2")),
        ],
        edges=[Edge("n0", "n1", 0), Edge("n0", "n2", 1), Edge("n2", "n3", 0)],
        roots=["n0"],
    )
    console = Console(width=100, color_system=None, record=True)
    console.print(g.memory())
    text = console.export_text()
    # ranked by activations: enc.0 holds more bytes, but most of them are its weight
    assert text.splitlines() == [
        "saved tensors hold 4.0 KiB of activations in 2 storages (held only by the graph), "
        "2.0 KiB aliasing ",
        "parameters/inputs (alive without the graph too); 6.0 KiB in 3 storages in all",
        "module  activations  share  params/inputs",
        "enc.1       3.0 KiB  75.0%              -",
        "enc.0       1.0 KiB  25.0%        2.0 KiB",
    ]
    console = Console(width=100, color_system=None, record=True)
    console.print(g.memory().render(depth=0))  # depth 0: everything in the root module
    assert "4.0 KiB  100.0%        2.0 KiB" in console.export_text()
    # depth counts levels as Graph.collapse does: enc.0 is one level (index with container)
    assert g.memory().module_bytes(1) == {"enc.0": 3072, "enc.1": 3072}
    assert g.memory().node_labels() == {
        "n0": "1.0 KiB activations + 2.0 KiB params/inputs", "n1": "3.0 KiB activations"
    }


# ---------------------------------------------------------------------- live accounting
@pytest.mark.parametrize("name", ["mlp", "cnn", "custom_function", "checkpointing"])
def test_live_accounting_matches_graph_memory(name):
    mf = gs.load_model_file(SAMPLES / f"{name}.py")
    model, inputs, _ = mf.build()
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    with gs.saved_memory(model) as mem:
        out = model(*args)
    rep = gs.trace(out, model=model).memory()
    live = mem.report()
    assert live.total == rep.total == sum(reference_storages(out).values())
    assert live.by_module == rep.by_module
    assert live.leaf_bytes == rep.leaf_bytes
    assert live.peak >= live.total and live.saved_total >= live.total


def test_live_accounting_without_a_model_takes_the_first_module_called():
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh())
    with gs.saved_memory() as mem:
        out = net(torch.randn(4, 8))
    assert mem.by_module == {"0": 4 * 8 * 4, "1": 4 * 32 * 4}
    assert mem.total == sum(reference_storages(out).values())


def test_peak_sees_tensors_freed_during_the_forward():
    x = torch.randn(1000, requires_grad=True)
    with gs.saved_memory() as mem:
        kept = x.sin()  # saves x (a leaf, 4000 B) and keeps it
        for _ in range(3):
            x.exp().sum().backward()  # each graph saves its 4000 B result, then frees it
    assert mem.peak == 8000  # x plus one exp result at a time
    assert mem.total == 4000 == mem.report().leaf_bytes
    assert mem.report().saved_total == 4 * 4000
    del kept
    assert mem.held_now == 0


def test_checkpointing_saves_fewer_bytes():
    ckpt = load_sample("checkpointing")
    live = ckpt.compare()
    plain = live["none"].total
    for mode in ("non_reentrant", "reentrant"):
        assert 0 < live[mode].total < plain / 4
    graphs = {}
    for mode in ckpt.MODES:
        net = ckpt.make(mode)
        out = ckpt.loss_fn(net(ckpt.example_input))
        graphs[mode] = gs.trace(out).memory().total
        if mode != "non_reentrant":  # reading its _saved_* attributes would recompute
            assert graphs[mode] == sum(reference_storages(out).values())
    assert graphs["none"] == plain
    # Non-reentrant checkpoint keeps the block inputs in its own frame, out of the graph's
    # reach: the graph shows even less than the live figure.
    assert 0 < graphs["non_reentrant"] < live["non_reentrant"].total
    assert graphs["reentrant"] < plain / 4


def test_hooks_are_removed_even_when_the_forward_raises():
    class Boom(torch.nn.Module):
        def forward(self, x):
            x.exp()
            raise ValueError("boom")

    hooks_before = (len(nn_module._global_forward_hooks), len(nn_module._global_forward_pre_hooks))
    with pytest.raises(ValueError):
        with gs.saved_memory(Boom()):
            Boom()(torch.randn(2, requires_grad=True))
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert (len(nn_module._global_forward_hooks), len(nn_module._global_forward_pre_hooks)) == (
        hooks_before
    )
    mem = gs.saved_memory()
    with pytest.raises(_memory.MemoryHooksError, match="after the with-block"):
        mem.report()


def test_in_place_change_of_a_saved_tensor_still_raises():
    def run(hooks: bool):
        a = torch.randn(10, requires_grad=True) * 1
        if hooks:
            with gs.saved_memory():
                b = a * a
        else:
            b = a * a
        a.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()

    run(False)
    run(True)


# ---------------------------------------------------------------------- results unchanged
def _train_snapshot(sample: str, wrap) -> list[torch.Tensor]:
    torch.manual_seed(0)
    if sample == "leaky_training":
        mod = load_sample(sample)
        with wrap() as hook:
            net, history = mod.train(steps=3, fixed=True, on_step=getattr(hook, "step", None))
        return [p.detach().clone() for p in net.parameters()] + [torch.tensor(history)]
    mod = load_sample(sample)
    net = mod.make("non_reentrant")
    with wrap():
        loss = mod.loss_fn(net(mod.example_input))
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in net.parameters()]


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


@pytest.mark.parametrize(
    "sample, wrap",
    [
        ("checkpointing", gs.saved_memory),
        ("leaky_training", gs.saved_memory),
        ("leaky_training", lambda: gs.leak_check(warn=False)),
    ],
)
def test_results_bitwise_identical_with_accounting_on_and_off(sample, wrap):
    off = _train_snapshot(sample, _Nothing)
    on = _train_snapshot(sample, wrap)
    assert len(on) == len(off)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))


def _double_backward(wrap) -> list[torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    with wrap():  # saves leaves (x, w), outputs (exp, tanh) and intermediates
        f = (x * w).exp().pow(2).sum() + torch.tanh(x @ w)
    (g,) = torch.autograd.grad(f, x, create_graph=True, retain_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), w, retain_graph=True)
    f.backward()
    return [f.detach(), g.detach(), gg, x.grad, w.grad]


@pytest.mark.parametrize("wrap", [gs.saved_memory, lambda: gs.leak_check(warn=False)])
def test_double_backward_bitwise_identical_with_accounting(wrap):
    off, on = _double_backward(_Nothing), _double_backward(wrap)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))


# ---------------------------------------------------------------------- leak detector
def test_leaky_sample_is_flagged_with_growing_bytes():
    mod = load_sample("leaky_training")
    with gs.leak_check(warn=False) as check:
        _, history = mod.train(steps=5, on_step=check.step)
    held = [found.held_bytes for found in check.history]
    assert held[0] == 0 and all(a < b for a, b in zip(held, held[1:], strict=False))
    last = check.history[-1]
    assert [leak.step for leak in last.leaks] == [0, 1, 2, 3]
    # Each leaked step holds its validation graph's activations: its storages, minus the
    # parameters (held by the model anyway), as PyTorch's own nodes report them.
    val_loss = history[0][1]
    params = {p.untyped_storage().data_ptr() for p in _params_of(val_loss)}
    expected = sum(n for k, n in reference_storages(val_loss).items() if k[1] not in params)
    assert last.leaks[0].saved_bytes == expected > 0
    assert "step 0" in str(last.leaks[0]) and ".detach()" in str(last.leaks[0])


def _params_of(t: torch.Tensor) -> list[torch.Tensor]:
    seen, stack, out = set(), [t.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            out.append(fn.variable)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return out


def test_fixed_sample_is_silent():
    mod = load_sample("leaky_training")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gs.leak_check() as check:
            mod.train(steps=5, fixed=True, on_step=check.step)
    assert len(check.history) == 5 and not any(check.history) and check.leaks == []
    assert str(check.report()).startswith("no autograd graph outlived its step")


def test_a_kept_loss_is_flagged_even_after_backward():
    w = torch.randn(8, requires_grad=True)
    kept = []
    with pytest.warns(_memory.GraphLeakWarning, match=r"nodes are still held") as caught:
        with gs.leak_check() as check:
            for _ in range(3):
                loss = (w.exp() * w).sum()
                loss.backward()
                kept.append(loss)  # backward freed the saved tensors; the nodes stay
                check.step()
    assert [leak.step for leak in check.history[-1].leaks] == [0, 1]
    assert check.history[-1].held_bytes == 0
    assert [str(w.message).split(" is still")[0] for w in caught] == [
        "the autograd graph of step 0", "the autograd graph of step 1"
    ]
    kept.clear()
    with gs.leak_check(warn=False) as check:  # the same loop, dropping the loss
        for _ in range(3):
            loss = (w.exp() * w).sum()
            loss.backward()
            check.step()
    assert not any(check.history)


def test_an_undetached_hidden_state_is_flagged():
    rnn = torch.nn.RNNCell(4, 8)
    for detach, leaking in ((False, True), (True, False)):
        h = torch.zeros(2, 8)
        with gs.leak_check(warn=False) as check:
            for _ in range(4):
                h = rnn(torch.randn(2, 4), h)
                h.pow(2).sum().backward(retain_graph=not detach)
                if detach:
                    h = h.detach()
                check.step()
        assert bool(check.history[-1]) is leaking
    assert check.remove() is None  # removing twice is safe


def test_leak_check_rejects_zero_grace():
    with pytest.raises(gs.GradscopeError, match="grace must be at least 1"):
        gs.leak_check(grace=0)


# ---------------------------------------------------------------------- CUDA figures
def test_cuda_figures_are_skipped_on_the_cpu():
    net = torch.nn.Linear(4, 4)
    with gs.saved_memory(net) as mem:
        loss = net(torch.randn(3, 4)).sum()
    with mem.backward():
        loss.backward()
    assert mem.report().cuda == []
    assert "cuda" not in _render(mem.report())


def test_cuda_figures_are_skipped_for_a_cpu_model_while_cuda_is_in_use(monkeypatch):
    monkeypatch.setattr(_memory, "_current_cuda_device", lambda: torch.device("cuda", 0))
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda d: 1)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: None)
    net = torch.nn.Linear(4, 4)
    with gs.saved_memory(net) as mem:
        net(torch.randn(3, 4)).sum()
    assert mem.report().cuda == []


def test_cuda_figures_are_recorded_around_forward_and_backward(monkeypatch):
    """The CUDA code path, with the allocator figures faked (this machine has no GPU)."""
    allocated = iter(range(100, 10_000, 100))
    monkeypatch.setattr(_memory, "_model_cuda_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: next(allocated))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 4096)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 8192)
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    net = torch.nn.Linear(4, 4)
    with gs.saved_memory(net) as mem:
        loss = net(torch.randn(3, 4)).sum()
    with mem.backward():
        loss.backward()
    cuda = mem.report().cuda
    assert [s.phase for s in cuda] == [
        "before forward", "after forward", "before backward", "after backward"
    ]
    assert [s.allocated for s in cuda] == [100, 200, 300, 400]
    assert all(s.device == "cuda:0" and s.reserved == 4096 for s in cuda)
    assert len(resets) == 2
    assert re.search(r"cuda:0 after backward: allocated 400 B, reserved 4\.0 KiB", _render(mem))


def _render(renderable) -> str:
    console = Console(width=120, color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def test_leak_check_as_an_object_and_nested_with_saved_memory():
    w = torch.randn(16, requires_grad=True)
    kept = []
    check = gs.leak_check(warn=False)  # hooks on at once, as GradMonitor(leaks=True) uses it
    for _ in range(3):
        with gs.saved_memory() as mem:  # inner hooks: both still see every saved tensor
            loss = (w.sin() * w).sum()
        kept.append(loss)
        found = check.step()
    check.remove()
    check.remove()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    # sin saves w (a leaf); mul saves sin(w) (an activation) and w again
    assert (mem.total, mem.report().leaf_bytes) == (128, 64)
    assert [leak.step for leak in found.leaks] == [0, 1]
    # what each leaked graph holds: the sin(w) result its mul saved (w is a leaf: not counted)
    assert [leak.saved_bytes for leak in found.leaks] == [64, 64] and found.held_bytes == 128


# ---------------------------------------------------------------------- samples through the CLI
@pytest.mark.parametrize(
    "spec", ["checkpointing.py", "checkpointing.py:build_reentrant", "leaky_training.py"]
)
def test_memory_samples_run_through_the_cli(spec):
    proc = run_cli("tree", str(SAMPLES / spec))
    assert proc.returncode == 0, proc.stderr
    expected = "CheckpointFunctionBackward" if "reentrant" in spec else "AddmmBackward0"
    assert expected in proc.stdout


@pytest.mark.parametrize(("name", "expected"), [("checkpointing", "non_reentrant: saved"),
                                              ("leaky_training", "held")])
def test_memory_samples_run_as_scripts(name: str, expected: str):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(SAMPLES / f"{name}.py")],
        capture_output=True, text=True, timeout=120, env={"COLUMNS": "100", "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout
