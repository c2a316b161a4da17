"""A module built inside ``record_forward(check_finite=True)`` is no finding, whatever memory
``torch.empty`` hands its parameters: every module here, given parameters that start as all NaN
(the worst that uninitialised memory can hold), is built, run, and found finite. Before the
recorder knew that ``nn.init`` writes over a tensor without reading it, each of them was a
false "a parameter held nan" (at random, as memory happened to hold NaN bits)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradscope as gs

REAL_EMPTY = torch.empty


def nan_empty(*args, **kwargs) -> torch.Tensor:
    """``torch.empty`` whose floating memory is all NaN, made where no mode sees it (as the
    allocator would hand it over)."""
    with torch._C.DisableTorchFunction():
        t = REAL_EMPTY(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
    return t


def two(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x, x)


def attention(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x, x, x)[0]


MODULES = {
    "Linear": (lambda: nn.Linear(4, 3), (2, 4), None),
    "Conv2d": (lambda: nn.Conv2d(3, 4, 3), (1, 3, 8, 8), None),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(3, 2, 3), (1, 3, 5, 5), None),
    "LayerNorm": (lambda: nn.LayerNorm(4), (2, 4), None),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(4), (3, 4), None),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3), None),
    "PReLU": (lambda: nn.PReLU(), (3,), None),
    "Bilinear": (lambda: nn.Bilinear(3, 3, 2), (2, 3), two),
    "MultiheadAttention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), (2, 5, 8),
                           attention),
    "LSTM": (lambda: nn.LSTM(4, 6), (3, 2, 4), lambda m, x: m(x)[0]),
    "GRU": (lambda: nn.GRU(4, 6), (3, 2, 4), lambda m, x: m(x)[0]),
    "TransformerEncoderLayer": (
        lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), (2, 5, 8), None),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_built_in_the_recorder_from_nan_memory_is_no_finding(monkeypatch, name):
    make, shape, call = MODULES[name]
    x = torch.randn(*shape)
    monkeypatch.setattr(torch, "empty", nan_empty)
    with gs.record_forward(check_finite=True) as fw:
        m = make()
        out = call(m, x) if call else m(x)
        out.sum()
    assert fw.first_nonfinite is None
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_embedding_from_nan_memory_is_no_finding(monkeypatch):
    monkeypatch.setattr(torch, "empty", nan_empty)
    with gs.record_forward(check_finite=True) as fw:
        emb = nn.Embedding(5, 3, padding_idx=0)
        out = emb(torch.tensor([0, 1]))
    assert fw.first_nonfinite is None and out[0].abs().sum() == 0


def test_a_parameter_left_as_nan_memory_is_still_found(monkeypatch):
    """The recorder still says what really is NaN: a parameter nobody initialised."""
    monkeypatch.setattr(torch, "empty", nan_empty)
    with gs.record_forward(check_finite=True) as fw:
        w = nn.Parameter(torch.empty(3, 4))
        (torch.randn(2, 3) @ w).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.kind) == ("a parameter", "nan")
