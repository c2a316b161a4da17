"""The check report at 80 columns: names and numbers whole (golden), as when piped."""

from __future__ import annotations

import io

import torch
from conftest import SAMPLES
from rich.console import Console

import gradscope as gs


class _WrongScale(torch.autograd.Function):
    """Backward off by a factor: large and small numbers in every column."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w * 1234.5678

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 1234.5678 * 1.001, g * x * 1.0e-5


def render(result, width: int) -> str:
    console = Console(width=width, color_system=None, file=io.StringIO(), legacy_windows=False)
    console.print(result)
    return console.file.getvalue()


def test_check_report_at_80_columns(golden):
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    result = gs.check(_WrongScale.apply, x, w, double=False)
    text = render(result, 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    for f in result.failures:  # every number and index of the table, whole on one line
        assert f"{f.numerical:.6g}" in text and f"{f.analytical:.6g}" in text
    golden("check_80.txt", text)


def test_sample_check_at_80_columns_keeps_element_indices_whole():
    mf = gs.load_model_file(f"{SAMPLES / 'functions.py'}:WrongClippedReLU")
    result = gs.check(mf.get("WrongClippedReLU"), *mf.get("WrongClippedReLU_inputs")())
    text = render(result, 80)
    assert "in[0, 0] / out[0, 0]" in text
