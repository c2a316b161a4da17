"""gradscope/_torch/torchcompat.py: torch internals behind feature detection. On the torch that
runs the suite (2.13, 2.14 and 2.15 in CI) every feature is found; a missing one (simulated by
taking it away) degrades with one line, never an exception from inside gradscope."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import gradscope as gs
from gradscope._torch import torchcompat
from gradscope.backward import forward
from gradscope.errors import MemoryHooksError


def test_every_feature_is_found_on_the_torch_under_test():
    assert torchcompat.HAS_MODE_STACK and torchcompat.HAS_SAVED_HOOKS
    assert torchcompat.aot_region_support() is None
    assert torchcompat.saved_hooks_missing() is None


def test_every_probe_finds_torchs_own_internal_on_the_torch_under_test(monkeypatch):
    """Each feature probe of torchcompat, on the torch that runs the suite (every CI leg: 2.13,
    2.14 and 2.15): the internal it looks for is found, so no fallback is taken and no note is
    written. A new torch that drops or moves one fails here first, by name."""
    import torch._dynamo  # noqa: F401  (the Dynamo probes read what it loads)

    monkeypatch.setattr(torchcompat, "_NOTES", {})
    tc = torchcompat
    assert tc.next_sequence_nr is not tc._probe_sequence_nr  # _get_sequence_nr
    assert tc.storage_key is not tc._storage_key_fallback  # _storage_address
    assert tc.current_graph_task_id is not tc._no_graph_task
    assert callable(tc.queue_engine_callback)  # the engine's queue_callback
    assert tc.inference_mode is not torch.inference_mode  # torch._C._InferenceMode
    assert tc.CUSTOM_BASE is torch.autograd.function.BackwardCFunction
    assert tc.compiling is torch.compiler.is_compiling
    # torch.func's wrapped tensors are told apart from plain ones
    x = torch.randn(3)
    seen = []
    torch.func.vmap(lambda t: (seen.append(tc.is_functorch_wrapped(t)), t * 1)[1])(x)
    assert seen == [True] and tc.is_functorch_wrapped(x) is False
    # Dynamo: the frame-exec strategy (not the older skip_code) and the compile callbacks
    skip = tc.frame_skipper()
    assert skip is not None and skip.__name__ == "mark"
    assert tc.compile_callbacks() is not None
    # the global hooks-with-kwargs table that forget_kwargs_flag cleans
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, k, o: None, with_kwargs=True)
    flags = torch.nn.modules.module._global_forward_hooks_with_kwargs
    assert isinstance(flags, dict) and handle.id in flags
    handle.remove()
    tc.forget_kwargs_flag(handle)
    assert handle.id not in flags
    # a GradScaler's scale tensor and its per-optimizer state
    w = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    assert tc.grad_scaler_scale(scaler) is None  # before its first scale()
    scaler.scale((w * 2).sum()).backward()
    assert isinstance(tc.grad_scaler_scale(scaler), torch.Tensor)
    assert tc.grad_scaler_unscaled(scaler, opt) is False
    scaler.unscale_(opt)
    assert tc.grad_scaler_unscaled(scaler, opt) is True
    # the other reads
    assert tc.is_op_overload(torch.ops.aten.mm.default)
    assert tc.local_tensor(x) is x
    assert tc.custom_forward_code(Scale.apply(x.requires_grad_()).grad_fn) is (
        Scale.forward.__code__)
    assert tc.notes() == []


def test_the_fallbacks_agree_with_the_internals_they_replace():
    x = torch.randn(3, requires_grad=True)
    # the counter the probe reads is the one torch's own peek returns (the probe uses one)
    before = torchcompat.next_sequence_nr()
    probed = torchcompat._probe_sequence_nr()
    assert probed == before + 1
    y = x * 2
    assert y.grad_fn._sequence_nr() == probed
    t = torch.arange(6.0)
    assert torchcompat.storage_key(t[2:]) == torchcompat.storage_key(t)
    assert torchcompat._storage_key_fallback(t[2:]) == torchcompat._storage_key_fallback(t)
    assert torchcompat.storage_key(t) != torchcompat.storage_key(t.clone())


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _helper(ctx, x)

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _helper(ctx, x):  # takes ctx but is not a forward: must not be taken for one
    return x * 2


class AmpScale(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x):
        return x * 3

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        return g * 3


def _calls():
    x = torch.randn(4, requires_grad=True)
    a = Scale.apply(x)  # line: scale
    b = AmpScale.apply(a)  # line: amp
    return (a + b).sum()


def test_custom_functions_get_the_line_that_called_apply():
    """On torch <= 2.13 ``Function.apply`` is a Python frame between the user's line and the
    forward, from 2.14 a builtin: both give the user's line, decorators and helpers too."""
    with gs.record_forward():
        loss = _calls()
    with gs.record_backward(loss) as rec:
        loss.backward()
    graph = rec.graph
    src, start = inspect.getsourcelines(_calls)
    for name, marker in [("ScaleBackward", "# line: scale"), ("AmpScaleBackward", "# line: amp")]:
        line = start + next(i for i, s in enumerate(src) if marker in s)
        (node,) = [n for n in graph.nodes if n.name == name]
        assert re.match(rf".*test_torchcompat\.py:{line}: ", node.created_at or ""), node


def test_without_the_mode_stack_record_forward_still_works(monkeypatch):
    monkeypatch.setattr(torchcompat, "HAS_MODE_STACK", False)
    monkeypatch.setattr(torchcompat, "_NOTES", {})
    model = torch.nn.Linear(3, 2)
    with gs.record_forward():
        assert forward.dynamo.mode_on_top(object()) is False
        out = model(torch.randn(2, 3)).sum()
    assert gs.trace(out).nodes
    (line,) = torchcompat.notes()
    assert "mode stack" in line and torch.__version__ in line and "\n" not in line


def test_without_saved_tensor_hooks_saved_memory_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(torchcompat, "HAS_SAVED_HOOKS", False)
    with pytest.raises(MemoryHooksError) as info:
        with gs.saved_memory():
            pass
    msg = str(info.value)
    assert "\n" not in msg and torch.__version__ in msg and "saved_memory" in msg


def test_a_function_without_forward_class_is_noted_not_raised(monkeypatch):
    monkeypatch.setattr(torchcompat, "_NOTES", {})

    class NoForwardCls:  # what a ctx would look like if torch stopped naming its Function
        pass

    assert torchcompat.custom_forward_code(NoForwardCls()) is None
    assert len(torchcompat.notes()) == 1 and "forward lines" in torchcompat.notes()[0]


def test_without_node_metadata_or_versions_plans_lose_segments_and_say_so(monkeypatch):
    monkeypatch.setattr(torchcompat, "_NOTES", {})
    assert torchcompat.node_metadata(object()) is None
    assert torchcompat.tensor_version(object()) is None  # type: ignore[arg-type]
    x = torch.randn(2)
    assert torchcompat.tensor_version(x) == x._version
    assert torchcompat.node_metadata((x.requires_grad_() * 2).grad_fn) == {}
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True),
                                torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(64, 8)
    assert gs.activation_report(model, x).segments()  # the torch under test has both
    monkeypatch.setattr(torchcompat, "node_metadata", lambda node: None)
    monkeypatch.setattr(torchcompat, "tensor_version", lambda t: None)
    rep = gs.activation_report(model, x)
    assert rep.segments() == []
    assert not any(i.mutates_input for i in rep.modules.values())
    assert all(".." not in m for plan in rep.sweep() for m in plan.modules)
    lines = torchcompat.notes("tensor_version", "node_metadata")
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert rep.notes == lines
