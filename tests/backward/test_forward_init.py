"""A module built inside ``record_forward(check_finite=True)`` is no finding, whatever memory
``torch.empty`` hands its parameters: every module here, given parameters that start as all NaN
(the worst that uninitialised memory can hold), is built, run, and found finite. Before the
recorder knew that ``nn.init`` writes over a tensor without reading it, each of them was a
false "a parameter held nan" (at random, as memory happened to hold NaN bits)."""

from __future__ import annotations

import pytest
import torch
from conftest import nan_empty
from torch import nn

import gradscope as gs


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


INITS = {
    "normal_": nn.init.normal_,
    "uniform_": nn.init.uniform_,
    "trunc_normal_": nn.init.trunc_normal_,  # reads new_tensor(a) first: a shape, not values
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
    "kaiming_uniform_": lambda p: nn.init.kaiming_uniform_(p, a=5 ** 0.5),
    "kaiming_normal_": nn.init.kaiming_normal_,
    "constant_": lambda p: nn.init.constant_(p, 0.5),
    "zeros_": nn.init.zeros_,
    "ones_": nn.init.ones_,
    "eye_": nn.init.eye_,  # torch.eye(..., out=p)
    "sparse_": lambda p: nn.init.sparse_(p, 0.5),
    "orthogonal_": nn.init.orthogonal_,  # new_empty(shape), then p.view_as(q).copy_(q)
    # Hugging Face's _init_weights writes through .data
    "data.normal_": lambda p: p.data.normal_(mean=0.0, std=0.02),
    "data.zero_": lambda p: p.data.zero_(),
    "data[:] =": lambda p: p.data.__setitem__(slice(None), 1.0),
    "data.copy_": lambda p: p.data.copy_(torch.ones_like(p)),
}


@pytest.mark.parametrize("name", sorted(INITS))
def test_a_parameter_initialised_from_nan_memory_is_no_finding(monkeypatch, name):
    monkeypatch.setattr(torch, "empty", nan_empty)
    p = nn.Parameter(torch.empty(3, 4))
    with gs.record_forward(check_finite=True) as fw:
        INITS[name](p)
        (torch.randn(2, 3) @ p).sum()
    assert torch.isfinite(p).all()
    assert fw.first_nonfinite is None


def test_a_nan_input_read_through_a_view_is_said_as_the_input():
    """A view reads no value, but the input it shows is still the one that held the NaN."""
    lin = nn.Linear(6, 2)
    x = torch.randn(4, 3)
    x[1, 1] = float("nan")
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input x", x)])
        lin(x.view(2, 6)).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("the input x", "view")
    # a NaN written in through a view is the writer's, not the parameter's
    p = nn.Parameter(torch.ones(3, 4))
    src = torch.full((12,), float("nan"))
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input src", src)])
        with torch.no_grad():
            p.view(-1).copy_(src)
        (p * 2).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("the input src", "copy_")
    p = nn.Parameter(torch.ones(3, 4))
    with gs.record_forward(check_finite=True) as fw:
        with torch.no_grad():
            p.data.copy_(torch.ones(3, 4).log_().neg_().log_())  # log(-0.) = -inf, made here
        (p * 2).sum()
    assert fw.first_nonfinite.input is None and fw.first_nonfinite.op == "log_"


def test_a_value_set_into_a_tensor_is_read_by_the_assignment():
    """``y[:] = x`` computes y's values from x: a NaN in x is first read there."""
    x = torch.tensor([1.0, float("nan")])
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input x", x)])
        y = torch.zeros(2)
        y[:] = x
        (y * 2).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("the input x", "__setitem__")


def test_an_input_nothing_computes_from_is_said_as_the_forward_left_it():
    """Only the shape of ``y`` is read: its NaN is said (the batch holds it), unless the
    forward wrote it over through an alias meanwhile."""
    w = torch.ones(3, requires_grad=True)
    y = torch.full((2,), float("nan"))
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input y", y)])
        (w * float(y.shape[0])).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("the input y", "")
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input y", y)])
        (w * float(y.shape[0])).sum()
        y.data.zero_()
    assert fw.first_nonfinite is None
