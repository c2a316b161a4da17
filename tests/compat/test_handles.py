"""One handle type for every hook owner: idempotent removal, on exit and on error."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_mod

import gradscope as gs
from gradscope._torch.handles import HookHandle


def test_remove_is_idempotent_and_newest_first():
    order = []
    h = HookHandle()
    h.add(lambda: order.append("a"))
    h.add(lambda: order.append("b"))
    assert len(h) == 2
    h.remove()
    h.remove()
    assert order == ["b", "a"] and h.removed and len(h) == 0


def test_a_failing_removal_does_not_leave_the_others():
    done = []
    h = HookHandle()
    h.add(lambda: done.append(1))

    def boom():
        raise RuntimeError("boom")

    h.add(boom)
    h.add(lambda: done.append(3))
    with pytest.raises(RuntimeError, match="boom"):
        h.remove()
    assert done == [3, 1]


def test_context_manager_removes_on_error():
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError), HookHandle() as h:
        h.add(lin.register_forward_hook(lambda *a: None))
        raise ValueError
    assert not lin._forward_hooks


def test_add_refuses_what_cannot_be_removed():
    with pytest.raises(TypeError):
        HookHandle().add(3)


def _global_state():
    return (
        len(module_mod._global_forward_hooks),
        len(module_mod._global_forward_pre_hooks),
        torch._C._autograd._top_saved_tensors_default_hooks(False),
        torch._C._len_torch_function_stack(),
    )


class _Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom in forward")


def _owners():
    model = nn.Sequential(nn.Linear(3, 3), _Boom())
    return model, {
        "scopes": lambda: gs.scopes(model),
        "record_forward": lambda: gs.record_forward(),
        "saved_memory": lambda: gs.saved_memory(model),
        "leak_check": lambda: gs.leak_check(warn=False),
        "GradMonitor": lambda: gs.GradMonitor(model),
    }


@pytest.mark.parametrize("owner", ["scopes", "record_forward", "saved_memory", "leak_check",
                                   "GradMonitor"])
def test_every_owner_leaves_nothing_when_the_block_raises(owner):
    model, owners = _owners()
    before = _global_state()
    with pytest.raises(RuntimeError, match="boom in forward"), owners[owner]():
        model(torch.randn(2, 3))
    assert _global_state() == before
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    for p in model.parameters():
        assert not p._post_accumulate_grad_hooks


def _hook_dicts(root):
    """The post-hook dict of every node below ``root`` (read through a probe hook's handle)."""
    out = []
    for fn in gs_walk([root.grad_fn]):
        probe = fn.register_hook(lambda *a: None)
        out.append((probe.hooks_dict_ref(), probe))
    return out


def gs_walk(starts):
    from gradscope._torch.stamps import walk_nodes

    return list(walk_nodes(starts))


def test_record_backward_removes_node_hooks_when_the_block_raises():
    x = torch.randn(3, requires_grad=True)
    y = (x.exp() * 2).sum()
    dicts = _hook_dicts(y)
    with pytest.raises(KeyError), gs.record_backward(y) as rec:
        assert all(len(d) == 2 for d, _ in dicts)  # the probe and the recorder's hook
        y.backward(retain_graph=True)
        raise KeyError("after backward")
    assert [s.name for s in rec.steps] == [
        "SumBackward0", "MulBackward0", "ExpBackward0", "AccumulateGrad"
    ]
    assert all(len(d) == 1 for d, _ in dicts)  # only the probes are left
