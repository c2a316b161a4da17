"""Worked custom ``torch.autograd.Function`` examples, after the course texts.

Each Function ``Name`` has a ``Name_inputs()`` giving small float64 example inputs, so that

    gradscope check samples/functions.py:ClippedReLU
    gradscope check samples/functions.py:WrongClippedReLU     # fails on purpose, exit code 1

gradchecks it. The inputs stay a little away from every kink (0 and ``clip_val`` for the clipped
ReLUs, ties for ``MaxWithIndex``) because finite differences straddling a kink measure the
average slope, not either one-sided derivative.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "ClippedReLU",
    "Cube",
    "CustomExp",
    "CustomSqrtInverse",
    "CustomSquareSum",
    "MaxWithIndex",
    "MulInPlace",
    "MyLinear",
    "WrongClippedReLU",
]


def _double(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


class MyLinear(Function):
    """``input @ weight.T + bias``, with an optional bias (``None`` gets a ``None`` gradient)."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        output = input.mm(weight.t())
        if bias is not None:
            output = output + bias.unsqueeze(0).expand_as(output)
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        # needs_input_grad skips work for inputs that do not require grad
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


def MyLinear_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True)
    return (x, w, b)


#: Inputs for the clipped ReLUs with clip_val=1.5: some below 0, some inside (0, 1.5), some
#: above 1.5, none within 0.1 of a kink.
_CLIP_X = [[-1.3, -0.4, 0.2, 0.7], [1.1, 1.9, 2.4, -2.0], [0.45, 1.35, -0.15, 3.0]]
CLIP_VAL = 1.5


class ClippedReLU(Function):
    """``min(max(0, x), clip_val)``; the gradient is 1 where ``0 < x < clip_val``, else 0."""

    @staticmethod
    def forward(ctx, input, clip_val):
        ctx.save_for_backward(input)
        ctx.clip_val = float(clip_val)  # a non-tensor argument lives on ctx, not in saved
        return input.clamp(min=0, max=ctx.clip_val)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        mask = (input > 0) & (input < ctx.clip_val)
        return grad_output * mask.to(grad_output.dtype), None  # None: clip_val is not a tensor


def ClippedReLU_inputs():
    return (_double(_CLIP_X), CLIP_VAL)


class WrongClippedReLU(Function):
    """Deliberately wrong: backward forgets the mask, so gradients leak where the output is
    clipped (x <= 0 or x >= clip_val). ``gs.check`` points at one of those elements."""

    @staticmethod
    def forward(ctx, input, clip_val):
        ctx.save_for_backward(input)
        ctx.clip_val = float(clip_val)
        return input.clamp(min=0, max=ctx.clip_val)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.clone(), None  # wrong: should be grad_output * mask


def WrongClippedReLU_inputs():
    return (_double(_CLIP_X), CLIP_VAL)


class CustomExp(Function):
    """``exp(x)``, saving its *result*: the derivative of exp is exp itself."""

    @staticmethod
    def forward(ctx, input):
        result = input.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


def CustomExp_inputs():
    return (_double([0.5, -1.0, 2.0, 0.1]),)


class CustomSquareSum(Function):
    """``sum(x ** 2)``, a scalar; the gradient is ``2 * x``."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return (input**2).sum()

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * 2 * input


def CustomSquareSum_inputs():
    return (_double([[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]]),)


class CustomSqrtInverse(Function):
    """``sqrt(x) + 1/x`` for positive x; the gradient is ``0.5/sqrt(x) - 1/x**2``."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input.sqrt() + torch.reciprocal(input)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * (0.5 / input.sqrt() - 1.0 / input**2)


def CustomSqrtInverse_inputs():
    return (_double([4.0, 9.0, 16.0, 0.5]),)


class MulInPlace(Function):
    """``x *= scale`` in place. ``ctx.mark_dirty`` tells autograd the input was modified, so the
    returned tensor (the same object) gets this node as its ``grad_fn``. Apply it to a non-leaf
    (e.g. ``x.clone()``): autograd refuses in-place changes to a leaf that requires grad."""

    @staticmethod
    def forward(ctx, input, scale):
        ctx.scale = float(scale)
        input.mul_(ctx.scale)
        ctx.mark_dirty(input)
        return input

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.scale, None


def MulInPlace_inputs():
    return (_double([[1.0, -2.0], [0.25, 3.0]]), 3.0)


class MaxWithIndex(Function):
    """Maximum over the last dimension, returning ``(values, indices)``. The indices are
    integers and marked non-differentiable; backward routes each gradient to the argmax."""

    @staticmethod
    def forward(ctx, input):
        values, indices = input.max(dim=-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.input_shape = tuple(input.shape)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        # scatter (not scatter_) keeps backward differentiable for double backward
        zeros = grad_values.new_zeros(ctx.input_shape)
        return zeros.scatter(-1, indices.unsqueeze(-1), grad_values.unsqueeze(-1))


def MaxWithIndex_inputs():
    # no ties within a row, so the argmax does not flip under a 1e-6 perturbation
    return (_double([[0.1, 2.0, -1.0], [3.0, 0.5, 1.5]]),)


class Cube(Function):
    """``x ** 3``, whose backward ``3 * x**2 * grad`` is built from differentiable torch ops on
    the saved input, so double backward (``create_graph=True``, Hessians) works through it."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input**3

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * 3 * input**2


def Cube_inputs():
    return (_double([1.0, -0.5, 2.0]),)


#: The correct Functions, for loops in tests and in the course scripts.
CORRECT = (MyLinear, ClippedReLU, CustomExp, CustomSquareSum, CustomSqrtInverse, MulInPlace,
           MaxWithIndex, Cube)
