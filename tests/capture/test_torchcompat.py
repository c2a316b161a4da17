"""gradscope/capture/torchcompat.py: torch internals behind feature detection. On the torch that
runs the suite (2.13 and 2.14 in CI) every feature is found; a missing one (simulated by
taking it away) degrades with one line, never an exception from inside gradscope."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import gradscope as gs
from gradscope.capture import forward, torchcompat
from gradscope.errors import MemoryHooksError


def test_every_feature_is_found_on_the_torch_under_test():
    assert torchcompat.HAS_MODE_STACK and torchcompat.HAS_SAVED_HOOKS
    assert torchcompat.aot_region_support() is None
    assert torchcompat.saved_hooks_missing() is None


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
