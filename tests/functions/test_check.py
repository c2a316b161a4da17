"""gs.check: torch's gradcheck/gradgradcheck decide pass/fail; the failures gradscope reports are
checked against Jacobians computed independently with torch.autograd.functional.jacobian."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import SAMPLES
from rich.console import Console
from torch.autograd.function import once_differentiable

import gradscope as gs

F = gs.load_model_file(SAMPLES / "functions.py").module


def _wrong():
    x, clip = F.WrongClippedReLU_inputs()
    return x, clip, gs.check(F.WrongClippedReLU, x, clip)


def test_wrong_clipped_relu_fails_at_input_0_inside_the_clipped_region():
    x, clip, result = _wrong()
    assert not torch.autograd.gradcheck(
        lambda t: F.WrongClippedReLU.apply(t, clip), (x,), raise_exception=False
    )
    assert not result.ok and result.passed[1] is False
    worst = result.failures[0]
    assert (worst.order, worst.input_index, worst.output_index) == (1, 0, 0)
    i_in, i_out = worst.index
    value = x.detach().reshape(-1)[i_in].item()
    assert i_in == i_out  # elementwise op: the mismatch is on the diagonal
    assert value <= 0 or value >= clip  # where the output is clipped, the true slope is 0
    assert (worst.numerical, worst.analytical, worst.diff) == pytest.approx((0.0, 1.0, 1.0))


def test_reported_jacobians_match_torch_functional_jacobian():
    x, clip, result = _wrong()
    (block,) = [b for b in result.jacobians if b.order == 1]
    # analytical = what the (wrong) backward gives; numerical = the true derivative of clamp
    ana = torch.autograd.functional.jacobian(lambda t: F.WrongClippedReLU.apply(t, clip), x)
    true = torch.autograd.functional.jacobian(lambda t: t.clamp(0, clip), x)
    n = x.numel()
    # torch's layout is (output..., input...); gradcheck's (and ours) is input rows x output cols
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(as_tensor(block.analytical), ana.reshape(n, n).T)
    torch.testing.assert_close(as_tensor(block.numerical), true.reshape(n, n).T)
    clipped = ((x <= 0) | (x >= clip)).reshape(-1).nonzero().reshape(-1).tolist()
    assert sorted(block.mismatches) == [(i, i) for i in clipped]
    assert len(result.failures) == 1  # one failing (input, output) pair, its worst element


def test_correct_clipped_relu_passes_and_clip_val_passes_through():
    x, clip = F.ClippedReLU_inputs()
    result = gs.check(F.ClippedReLU, x, clip)
    assert result.ok and torch.autograd.gradcheck(lambda t: F.ClippedReLU.apply(t, clip), (x,))
    assert result.notes == []


def test_float32_inputs_are_checked_as_float64_copies_with_a_note():
    x = torch.randn(4, requires_grad=True)
    result = gs.check(torch.tanh, x)
    assert result.ok
    assert any("float32" in n and "float64" in n for n in result.notes)
    assert x.dtype == torch.float32 and x.grad is None  # the caller's tensor is untouched


def test_plain_function_and_multiple_outputs():
    a = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    result = gs.check(lambda p, q: (p @ q, p.sin()), a, b)
    assert result.ok and result.name == "<lambda>"


class _DetachedCube(torch.autograd.Function):
    """Right first derivative, but backward detaches x, so second derivatives are lost."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x.detach() ** 2


def test_second_order_failure_is_located():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_DetachedCube.apply, (x,))
    assert not torch.autograd.gradgradcheck(_DetachedCube.apply, (x,), raise_exception=False)
    result = gs.check(_DetachedCube, x)
    assert not result.ok and result.passed == {1: True, 2: False}
    worst = result.failures[0]
    assert (worst.order, worst.input_index, worst.output_index) == (2, 0, 0)
    i_in, i_out = worst.index
    assert i_in == i_out  # d(3 x^2 v)/dx = diag(6 x v) for the random v in [-1, 1]
    assert worst.analytical == 0.0 and worst.numerical != 0.0
    assert abs(worst.numerical) <= 6 * abs(x[i_in].item()) + 1e-6
    assert gs.check(_DetachedCube, x, double=False).ok


class _Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def test_once_differentiable_fails_double_with_a_note_and_passes_single():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gs.check(_Once, x)
    assert not result.ok and result.passed[1] and not result.passed[2]
    assert any("--no-double" in n for n in result.notes)
    assert gs.check(_Once, x, double=False).ok


class _TooFewGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, g):
        return (g,)


def test_backward_that_raises_is_a_failed_check_not_a_crash():
    x = torch.randn(2, dtype=torch.float64, requires_grad=True)
    result = gs.check(_TooFewGrads, x, x.clone())
    assert not result.ok
    assert any("incorrect number of gradients" in n for n in result.notes)


@pytest.mark.parametrize(
    "fn, args, words",
    [
        (42, (torch.ones(2, dtype=torch.float64, requires_grad=True),), "expected a torch.auto"),
        (torch.sin, (), "no inputs"),
        (torch.neg, (torch.arange(3),), "no floating-point tensor"),
        (torch.mm, (torch.ones(2, 3, dtype=torch.float64, requires_grad=True),) * 2, "raised"),
        (lambda x: 3, (torch.ones(2, dtype=torch.float64, requires_grad=True),), "returned int"),
    ],
)
def test_unusable_inputs_raise_check_input_error(fn, args, words):
    with pytest.raises(gs.CheckInputError, match=words):
        gs.check(fn, *args)
    assert issubclass(gs.CheckInputError, gs.GradscopeError)


def test_inputs_without_requires_grad_are_all_checked_with_a_note():
    x = torch.randn(3, dtype=torch.float64)
    result = gs.check(torch.exp, x)
    assert result.ok and any("requires_grad=True" in n for n in result.notes)


def _render(result, color=False):
    console = Console(width=160, record=True, color_system="standard" if color else None,
                      force_terminal=color, file=io.StringIO())
    console.print(result)
    return console.export_text(styles=color)


def test_render_shows_both_jacobians_and_highlights_mismatches():
    x, clip, result = _wrong()
    text = _render(result)
    assert "FAIL" in text and "numerical" in text and "analytical" in text
    assert "in[0, 0] / out[0, 0]" in text
    coloured = _render(result, color=True)
    n_bad = len(result.jacobians[0].mismatches)
    # each mismatching entry is red in both matrices (the worst one reversed as well)
    assert coloured.count("\x1b[1;31m") + coloured.count("\x1b[1;7;31m") >= 2 * n_bad
    ok_text = _render(gs.check(F.CustomExp, *F.CustomExp_inputs()))
    assert ok_text.startswith("PASS CustomExp: passed gradcheck and gradgradcheck")
    assert "\x1b[" not in _render(result)  # no colour codes without a terminal


def test_jacobians_stack_when_the_console_is_narrow():
    _, _, result = _wrong()
    wide = _render(result)
    console = Console(width=60, record=True, color_system=None, file=io.StringIO())
    console.print(result)
    narrow = console.export_text()
    # the matrices' header row: twice on a line side by side, once per line when stacked
    assert max(line.count("in\\out") for line in wide.splitlines()) == 2
    assert max(line.count("in\\out") for line in narrow.splitlines()) == 1
    assert narrow.count("in\\out") == 2


def test_in_place_function_is_checked_without_touching_the_callers_tensor():
    x, scale = F.MulInPlace_inputs()
    before = x.detach().clone()
    version = x._version
    assert gs.check(F.MulInPlace, x, scale).ok
    assert torch.equal(x.detach(), before) and x._version == version and x.grad is None
