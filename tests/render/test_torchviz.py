"""gs.make_dot is a drop-in for torchviz.make_dot: same labels and colours on every graph
torchviz can draw, and it draws the graphs torchviz fails on."""

from __future__ import annotations

import re
import sys
from collections import Counter

import pytest
import torch
import torchviz
from graphs import ALL, chain, custom_saved_none

import gradscope as gs

NODE = re.compile(r'^\t(\S+) \[label=("(?:[^"\\]|\\.)*"|\S+)(.*)\]$')


def labels(dot) -> Counter:
    """(label, fillcolor) of every node statement in a graphviz.Digraph's body."""
    out: Counter = Counter()
    for line in dot.body:
        m = NODE.match(line.rstrip("\n"))
        if m:
            color = re.search(r"fillcolor=(\S+)", m.group(3))
            out[(m.group(2), color.group(1) if color else None)] += 1
    return out


def edge_count(dot) -> int:
    return sum(1 for line in dot.body if " -> " in line)


TORCHVIZ_DRAWABLE = ["mlp", "lstm_cell", "double_backward", "views", "inplace"]


@pytest.mark.parametrize("name", TORCHVIZ_DRAWABLE)
@pytest.mark.parametrize("show_attrs", [False, True])
def test_same_labels_as_torchviz(name, show_attrs):
    outputs, params = ALL[name]()
    ours = gs.make_dot(outputs, params=params, show_attrs=show_attrs)
    theirs = torchviz.make_dot(outputs, params=params, show_attrs=show_attrs)
    assert labels(ours) == labels(theirs)
    assert edge_count(ours) == edge_count(theirs)
    assert ours.graph_attr == theirs.graph_attr and ours.node_attr == theirs.node_attr


@pytest.mark.parametrize("name", TORCHVIZ_DRAWABLE)
def test_same_labels_with_saved_tensors(name):
    outputs, params = ALL[name]()
    ours = gs.make_dot(outputs, params=params, show_attrs=True, show_saved=True)
    theirs = torchviz.make_dot(outputs, params=params, show_attrs=True, show_saved=True)
    # torchviz merges a saved tensor into the leaf's box when it is the very same Python
    # object (its ids come from id()); gradscope always draws the saved box. Same labels.
    assert set(labels(ours)) == set(labels(theirs))


def test_returns_a_digraph_that_renders():
    outputs, params = ALL["mlp"]()
    dot = gs.make_dot(outputs, params=params)
    assert type(dot).__name__ == "Digraph"
    if gs.dot_binary():
        assert dot.pipe(format="svg").startswith(b"<?xml")


def test_source_is_identical_on_every_run():
    a = gs.make_dot(*ALL["lstm_cell"](), show_attrs=True, show_saved=True).source
    b = gs.make_dot(*ALL["lstm_cell"](), show_attrs=True, show_saved=True).source
    assert a == b


def test_deeper_than_the_recursion_limit():
    n = sys.getrecursionlimit() + 500
    y, x = chain(n)
    with pytest.raises(RecursionError):
        torchviz.make_dot(y)
    dot = gs.make_dot(y, params={"x": x})
    assert labels(dot)[('MulBackward0', None)] == n


def test_list_and_dict_outputs():
    a = torch.randn(3, requires_grad=True)
    outs = [a.exp(), {"s": a.sin()}]
    with pytest.raises(TypeError):  # torchviz hashes the list as if it were a tensor
        torchviz.make_dot(outs)
    dot = gs.make_dot(outs, params={"a": a})
    got = labels(dot)
    assert got[('ExpBackward0', None)] == 1 and got[('SinBackward0', None)] == 1
    assert got[('"\n (3)"', "darkolivegreen1")] == 2


def test_saved_tensors_already_freed():
    outputs, params = ALL["mlp"]()
    outputs.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torchviz.make_dot(outputs, params=params, show_saved=True)
    dot = gs.make_dot(outputs, params=params, show_attrs=True, show_saved=True)
    assert "[freed]" in dot.source and "freed" in dot.source


def test_custom_function_that_saved_none():
    outputs, params = custom_saved_none()
    with pytest.raises(AttributeError):
        torchviz.make_dot(outputs, params=params)
    dot = gs.make_dot(outputs, params=params)
    got = labels(dot)
    assert got[('Scale2Backward', None)] == 1
    assert got[('"\n (3)"', "orange")] == 2  # the two tensors it did save


def test_param_tensors_that_are_not_tensors_are_refused():
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(gs.GradscopeError):
        gs.make_dot(x.sum(), params={"x": "nope"})
