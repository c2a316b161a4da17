"""The worked Functions in samples/functions.py: correct against PyTorch's own gradients and
gradcheck, and visible in gs.trace as custom nodes with the tensors they saved."""

from __future__ import annotations

import pytest
import torch
from conftest import SAMPLES

import gradscope as gs

#: samples/functions.py, imported the way the CLI imports model files
F = gs.load_model_file(SAMPLES / "functions.py").module
CORRECT = [cls.__name__ for cls in F.CORRECT]
#: the built-in computation each Function reimplements (its ground truth)
REFERENCE = {
    "MyLinear": lambda x, w, b: torch.nn.functional.linear(x, w, b),
    "ClippedReLU": lambda x, c: x.clamp(0, c),
    "CustomExp": torch.exp,
    "CustomSquareSum": lambda x: (x**2).sum(),
    "CustomSqrtInverse": lambda x: x.sqrt() + 1 / x,
    "MulInPlace": lambda x, s: x * s,
    "MaxWithIndex": lambda x: x.max(dim=-1),
    "Cube": lambda x: x**3,
}


def _inputs(name):
    return getattr(F, f"{name}_inputs")()


def _apply(cls, args):
    # MulInPlace modifies its input: give it a non-leaf copy, as its docstring says
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    return cls.apply(*args)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", CORRECT)
def test_gradients_match_builtin_ops(name):
    cls = getattr(F, name)
    args = _inputs(name)
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    ours = torch.autograd.grad(_first(_apply(cls, args)).sum(), leaves)
    ref = torch.autograd.grad(_first(REFERENCE[name](*args)).sum(), leaves)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", CORRECT)
def test_torch_gradcheck_and_gradgradcheck_pass(name):
    cls, args = getattr(F, name), _inputs(name)
    fn = lambda *xs: _apply(cls, xs)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("name", CORRECT)
def test_gs_check_passes_with_double_backward(name):
    result = gs.check(getattr(F, name), *_inputs(name), double=True)
    assert result.ok, result.summary()
    assert result.orders == (1, 2)
    assert result.failures == []


@pytest.mark.parametrize("name", CORRECT)
def test_node_appears_in_trace_as_custom_with_saved_tensors(name):
    cls = getattr(F, name)
    out = _first(_apply(cls, _inputs(name)))
    graph = gs.trace(out)
    nodes = [n for n in graph.nodes if n.name == f"{name}Backward"]
    assert len(nodes) == 1
    node = nodes[0]
    assert node.kind == "custom"
    truth = out.grad_fn.saved_tensors  # ground truth from autograd itself
    got = [s for s in node.saved if s.name.startswith("saved_tensors[")]
    assert [s.shape for s in got] == [list(t.shape) for t in truth]
    assert [s.dtype for s in got] == [str(t.dtype).removeprefix("torch.") for t in truth]


def test_linear_without_bias_returns_none_for_it():
    x, w, _ = F.MyLinear_inputs()
    y = F.MyLinear.apply(x, w, None)
    torch.testing.assert_close(y, x @ w.T)
    assert gs.check(lambda a, b: F.MyLinear.apply(a, b, None), x, w).ok


def test_in_place_function_returns_its_input_marked_dirty():
    (x, scale) = F.MulInPlace_inputs()
    y = x.clone()
    base_version = y._version
    out = F.MulInPlace.apply(y, scale)
    assert out is y and y._version > base_version
    assert type(out.grad_fn).__name__ == "MulInPlaceBackward"


def test_indices_are_not_differentiable():
    values, indices = F.MaxWithIndex.apply(*F.MaxWithIndex_inputs())
    assert values.requires_grad and not indices.requires_grad
    ref_values, ref_indices = F.MaxWithIndex_inputs()[0].max(dim=-1)
    assert torch.equal(indices, ref_indices)


def test_cube_hessian_through_custom_backward():
    (x,) = F.Cube_inputs()
    (g,) = torch.autograd.grad(F.Cube.apply(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(h, 6 * x.detach())


def test_wrong_clipped_relu_fails_torch_gradcheck():
    args = F.WrongClippedReLU_inputs()
    assert not torch.autograd.gradcheck(
        lambda x: F.WrongClippedReLU.apply(x, args[1]), (args[0],), raise_exception=False
    )


def test_non_tensor_arguments_are_kept_on_ctx_and_shown_as_attrs():
    x, clip = F.ClippedReLU_inputs()
    node = next(n for n in gs.trace(F.ClippedReLU.apply(x, clip)).nodes if n.kind == "custom")
    assert node.attrs == {"clip_val": str(float(clip))}
    assert [s.shape for s in node.saved] == [list(x.shape)]
