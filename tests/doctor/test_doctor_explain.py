"""The doctor's explanations have one owner (closing note of issues 27-33): the functions of
``doctor_explain`` are given the plain pieces they read (``Watched``, the recording mode, the
lines and flags) and return findings; none takes the Doctor, none writes an attribute of what it
is given. ``Doctor`` keeps its own state and its findings."""

from __future__ import annotations

import ast
import inspect

import torch

import gradscope as gs
from gradscope.doctor import explain as doctor_explain
from gradscope.doctor.explain import (
    Watched,
    added_to,
    check_accumulate,
    check_step,
    stale_grads,
    still_carried,
)


def test_no_function_takes_the_doctor_or_writes_what_it_is_given():
    tree = ast.parse(inspect.getsource(doctor_explain))
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        assert "doc" not in params, fn.name
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    assert t.value.id not in params, f"{fn.name} writes {t.value.id}.{t.attr}"
    assert not hasattr(doctor_explain, "Doctor")  # no protocol of the Doctor's state either


def test_the_checks_return_findings_and_leave_their_inputs_alone():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(net[0].parameters(), lr=0.1)  # net[1] is in no param group
    net(torch.randn(2, 3)).sum().backward()
    watched = Watched.of(net)
    assert watched.names == [n for n, _ in net.named_parameters()]
    assert watched.param_site(2) == "1"
    found = check_step(watched, opt, "train.py:9", {})
    assert [(f.kind, key) for f, key in found] == [
        ("not_in_optimizer", ("not_in_optimizer", ("1.weight", "1.bias")))]
    assert check_step(watched, opt, "train.py:9", {}) == found  # no state: the same again
    stale = stale_grads(watched, opt)  # .grad left non-zero after the step: net[0]'s
    assert sorted(stale) == [0, 1]
    net[1](torch.randn(2, 3)).sum().backward()  # reaches no stale gradient
    assert added_to(watched, stale, "train.py:7") == {}
    net(torch.randn(2, 3)).sum().backward()
    carried = added_to(watched, stale, "train.py:7")
    assert sorted(carried) == [0, 1] and still_carried(watched, carried) == carried
    grads = [p.grad.clone() for p in net.parameters()]
    (acc, key), = check_accumulate(watched, opt, carried)
    assert acc.kind == "grads_accumulate" and key == ("grads_accumulate",)
    assert acc.line == "train.py:7"
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, net.parameters()))
    net[0].weight.grad = None  # zero_grad(): nothing carried into the step
    assert sorted(still_carried(watched, carried)) == [1]
    net[0].bias.grad.zero_()
    assert still_carried(watched, carried) == {}


def test_the_doctor_keeps_the_findings_the_checks_return():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(net[0].parameters(), lr=0.1)
    with gs.doctor(net, optimizer=opt) as doc:
        for _ in range(2):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
    kinds = [f.kind for f in doc.findings]
    assert kinds.count("not_in_optimizer") == 1 and kinds.count("grads_accumulate") == 1, kinds


def test_the_messages_count_in_words_one_or_many():
    """"1 parameter ... is ... updates it", "2 parameters ... are ... updates them": no
    "parameter(s)"."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False), torch.nn.Linear(3, 1))
    net(torch.randn(2, 3)).sum().backward()
    watched = Watched.of(net)
    one = torch.optim.SGD([net[0].weight, net[1].bias], lr=0.1)  # 1.weight left out
    (found, _), = check_step(watched, one, "train.py:9", {})
    assert found.message.startswith("1 parameter got gradients but is in no param group of the "
                                    "optimizer, so step() never updates it: "), found.message
    two = torch.optim.SGD([net[0].weight], lr=0.1)
    (found, _), = check_step(watched, two, "train.py:9", {})
    assert found.message.startswith("2 parameters got gradients but are in no"), found.message
    assert "updates them: " in found.message
    net[0].weight.requires_grad_(False)
    every = torch.optim.SGD(net.parameters(), lr=0.1)
    (found, _), = check_step(watched, every, "train.py:9", {})
    assert found.kind == "frozen_in_optimizer"
    assert found.message.startswith("1 frozen parameter (requires_grad=False) is in the "), found
    assert "skips it only while its .grad is None" in found.message
    assert "(s)" not in found.message
