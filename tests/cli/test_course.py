"""Every course script runs as a script and prints its point; its findings are checked against
PyTorch itself (strides, gradients, gradcheck, saved-tensor hooks), not against gradscope."""

from __future__ import annotations

import math
import runpy

import pytest
import torch
from conftest import SAMPLES, reference_walk

COURSE = SAMPLES / "course"
SCRIPTS = sorted(p.stem for p in COURSE.glob("*.py"))


def _run(name: str, capsys) -> tuple[dict, str]:
    """Run the script as __main__ (what `python script.py` does), then call its main()."""
    namespace = runpy.run_path(str(COURSE / f"{name}.py"), run_name="__main__")
    printed = capsys.readouterr().out
    found = namespace["main"]()
    capsys.readouterr()
    return found, printed


def test_every_script_is_listed_in_the_readme():
    readme = (COURSE / "README.md").read_text()
    assert SCRIPTS == sorted(EXPECTED)
    for name in SCRIPTS:
        assert f"`{name}.py`" in readme


def check_storage_strides(found, printed):
    t = torch.arange(12.0).reshape(3, 4)
    truth = {
        "t (3x4)": (t, True),
        "t.T (transpose)": (t.T, True),
        "t[1:, 2:] (slice)": (t[1:, 2:], True),
        "t.T.contiguous() (copy)": (t.T.contiguous(), False),
    }
    for label, (v, shares) in truth.items():
        e = found[label]
        assert (e.stride, e.storage_offset, e.is_contiguous) == (
            v.stride(), v.storage_offset(), v.is_contiguous())
        assert (e.shares_storage_with == [0]) == shares
    assert "stride (1, 4), offset 0, contiguous False, shares t's storage" in printed
    assert "stride (3, 1), offset 0, contiguous True, has its own storage" in printed


def check_dynamic_graph(found, printed):
    a = torch.tensor([2.0, 3.0], requires_grad=True)
    names, _ = reference_walk((a * 3).mean())
    got = {n.name for n in found["graph"].backward_nodes}
    assert got == set(names) == {"MeanBackward0", "MulBackward0", "AccumulateGrad"}
    assert "b: requires_grad=True, is_leaf=False, grad_fn=MulBackward0" in printed
    loop = runpy.run_path(str(COURSE / "dynamic_graph.py"))["repeat_until_large"]
    for start, count in found["mul_nodes"].items():
        names, _ = reference_walk(loop(torch.full((2,), start, requires_grad=True)))
        assert names["MulBackward0"] == count
    assert found["mul_nodes"][0.5] != found["mul_nodes"][3.0]


def check_engine_backward(found, printed):
    assert found["order"] == ["MeanBackward0", "MmBackward0", "AccumulateGrad"]
    assert found["x_grad"] is None
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(1, 5)
    (gw,) = torch.autograd.grad((x @ w).mean(), w)
    torch.testing.assert_close(found["w_grad"], gw)
    a = torch.tensor([1.0, 2.0])
    torch.testing.assert_close(found["a_grad"], 2 * a * (torch.cos(a * a) - torch.sin(a * a)))
    assert found["diamond"][-2:] == ["MulBackward0", "AccumulateGrad"]
    assert "engine order: MeanBackward0 -> MmBackward0 -> AccumulateGrad" in printed


def check_custom_function(found, printed):
    good, bad, x, clip = found["good"], found["bad"], found["x"], found["clip"]
    assert good.ok and not bad.ok
    node = next(n for n in found["graph"].nodes if n.kind == "custom")
    assert node.name == "ClippedReLUBackward" and node.attrs["clip_val"] == str(float(clip))
    value = x.reshape(-1)[bad.failures[0].index[0]].item()
    assert value <= 0 or value >= clip
    assert "PASS ClippedReLU" in printed and "FAIL WrongClippedReLU" in printed


def check_higher_order(found, printed):
    w, v = found["w"], found["v"]
    f = lambda t: t[0] ** 2 * torch.sin(t[1])  # noqa: E731
    _, ref = torch.autograd.functional.hvp(f, w, v)
    torch.testing.assert_close(found["hvp"], ref)
    torch.testing.assert_close(found["hvp"], torch.tensor([1.0, -1.0]))
    assert math.isclose(found["grad_f"][0].item(), 2.0)
    assert any(n.name == "CosBackward0" for n in found["graph"].nodes)  # sin's derivative, recorded
    assert "H v = " in printed


def check_hooks(found, printed):
    t = found["tensor"]
    torch.testing.assert_close(t["seen"], torch.ones(3))
    torch.testing.assert_close(t["x_grad"], 2 * (2 * t["x"]))
    m = found["module"]
    model = m["model"]
    torch.manual_seed(0)
    torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))  # same RNG
    x = torch.randn(3, 4)
    h = model[1](model[0](x)).detach().requires_grad_(True)
    (gh,) = torch.autograd.grad(model[2](h).pow(2).mean(), h)
    torch.testing.assert_close(m["grad_input"], gh)
    assert m["shapes"] == [(3, 8)]
    assert len(m["hook_nodes"]) == 2
    assert not model[1]._forward_hooks and not model[2]._backward_hooks  # handles removed
    assert "x.grad = [4.0, 8.0, 12.0]" in printed


def _saved_truth(depth: int, make_model) -> int:
    """Bytes saved for backward, from torch's own saved-tensor hooks, one count per storage."""
    held: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        held[key] = max(held.get(key, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        make_model(depth)(torch.randn(32, 64)).sum()
    return sum(held.values())


def check_saved_memory(found, printed):
    make_model = runpy.run_path(str(COURSE / "saved_memory.py"))["make_model"]
    for depth, nbytes in found["by_depth"].items():
        assert nbytes == _saved_truth(depth, make_model)
    assert found["retained"] == found["before"] > 0
    assert found["after"] == 0 and found["n_freed"] > 0
    assert 0 < found["checkpointed"] < found["before"]
    assert "CheckpointFunctionBackward" in printed


EXPECTED = {
    "storage_strides": check_storage_strides,
    "dynamic_graph": check_dynamic_graph,
    "engine_backward": check_engine_backward,
    "custom_function": check_custom_function,
    "higher_order": check_higher_order,
    "hooks": check_hooks,
    "saved_memory": check_saved_memory,
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_and_its_findings_hold(name, capsys):
    found, printed = _run(name, capsys)
    assert printed.strip()
    EXPECTED[name](found, printed)
