"""The graph page of a divergence (issue 49: "the graph page colours nodes by their error
against the reference and jumps to the first divergence"): ``gs.trace_divergence`` maps each
measured op to the autograd node it belongs to, the page colours the nodes, names the numbers
and opens on the first divergence; ``gradscope compare FILE --html`` writes it.

Ground truth: the planted float16 softmax overflow (``samples/numerics/softmax_fp16.py``), whose
divergence is its ``exp`` line; each node's error is compared with ``rel_error`` of the ops
matched here by hand (phase and op, each unique in that sample)."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import SAMPLES, in_process_cli
from torch import nn
from viewer_page import Page, embedded_data, launch_browser

import gradscope as gs
from gradscope.numerics.compare import rel_error

NUMERICS = SAMPLES / "numerics"


def _marked(name: str, marker: str) -> str:
    lines = (NUMERICS / f"{name}.py").read_text().splitlines()
    return f"{name}.py:{next(i + 1 for i, line in enumerate(lines) if marker in line)}"


def _softmax(half: bool = True):
    """The sample's reference (float32) and candidate runs, the candidate's loss and model."""
    mf = gs.load_model_file(NUMERICS / "softmax_fp16.py")
    model, x, _ = mf.build()
    target = mf.get("example_target")

    def step(m: nn.Module, inp: torch.Tensor):
        with gs.record_numerics(m) as run:
            loss = mf.loss(mf.run_model(m, inp), target)
            loss.backward()
        return run, loss

    ref, _ = step(copy.deepcopy(model), x)
    cand_model = copy.deepcopy(model)
    if half:
        cand_model = cand_model.half()
        x = x.half()
    cand, loss = step(cand_model, x)
    return ref, cand, loss, cand_model


def _op(run: gs.NumericsRun, phase: str, op: str, node: str | None = None):
    (found,) = [o for o in run.ops if o.phase == phase and o.op == op
                and (node is None or o.node == node)]
    return found


def _node(graph: gs.Graph, name: str) -> str:
    (found,) = [n.id for n in graph.nodes if n.name == name]
    return found


def test_the_first_divergence_is_marked_on_the_node_of_its_op():
    ref, cand, loss, model = _softmax()
    d = gs.compare_runs(ref, cand)
    assert (d.first.op, d.first.line) == ("aten.exp", _marked("softmax_fp16",
                                                                 "# overflows in float16"))
    page = gs.trace_divergence(loss, d, model=model)
    exp = _node(page.graph, "ExpBackward0")  # the one exp of the sample
    assert page.marks.first == exp
    e = page.marks.nodes[exp]
    assert e.diverged and math.isinf(e.error) and e.line == d.first.line
    # every other node it colours is before it (within tolerance) or made from its inf
    assert [nid for nid, n in page.marks.nodes.items() if n.diverged] == [exp]


def test_each_node_error_is_the_largest_rel_error_of_its_ops():
    ref, cand, loss, model = _softmax()
    page = gs.trace_divergence(loss, gs.compare_runs(ref, cand), model=model)
    nodes = page.marks.nodes
    add = nodes[_node(page.graph, "AddBackward0")]  # + 12.0: its forward only (no backward op)
    expected = rel_error(_op(ref, "forward", "aten.add").stats,
                         _op(cand, "forward", "aten.add").stats)
    assert 0 < expected < 1e-3 and add.error == expected and add.count == 1
    assert not add.diverged
    # the Linear's addmm: its forward, and its backward's mm and sum
    pairs = [("forward", "aten.addmm"), ("backward", "aten.mm"), ("backward", "aten.sum")]
    addmm = nodes[_node(page.graph, "AddmmBackward0")]
    errors = [rel_error(_op(ref, p, o, "AddmmBackward0").stats,
                        _op(cand, p, o, "AddmmBackward0").stats) for p, o in pairs]
    assert addmm.count == 3 and addmm.error == max(errors)
    # a parameter's leaf: its gradient (and its values, equal in both runs)
    diff = {p.name: p for p in gs.compare_runs(ref, cand).params}
    weight = nodes[_node(page.graph, "proj.weight")]
    assert weight.error == diff["proj.weight"].rel_error and weight.count == 2


def test_two_identical_runs_mark_nothing():
    mf = gs.load_model_file(NUMERICS / "softmax_fp16.py")
    model, x, _ = mf.build()
    runs = []
    for _ in range(2):
        m = copy.deepcopy(model)
        with gs.record_numerics(m) as run:
            loss = mf.loss(mf.run_model(m, x), mf.get("example_target"))
            loss.backward()
        runs.append(run)
    d = gs.compare_runs(*runs)
    assert d.ok
    page = gs.trace_divergence(loss, d, model=m)
    assert page.marks.first is None and page.marks.ok
    assert len(page.marks.nodes) >= 10
    assert all(n.error == 0.0 and not n.diverged for n in page.marks.nodes.values())
    data = embedded_data(page.to_html())
    assert data["numerics"]["first"] == -1 and data["numerics"]["ok"] is True
    k = {name: key for name, key, _ in data["info"]}["numerics"]
    f = data["fields"]["numerics"]
    rows = [n[4][k] for n in data["nodes"] if len(n) > 4 and n[4] and k in n[4]]
    assert len(rows) == len(page.marks.nodes)
    diverged = f.index("diverged")
    assert all(r[f.index("error")] == 0 and r[diverged:diverged + 1] in ([], [0]) for r in rows)


def test_a_graph_of_another_run_is_not_coloured():
    """The link is the candidate's own autograd nodes: a graph traced from another run (the
    reference's loss) has none of them."""
    ref, cand, _, _ = _softmax()
    _, _, other_loss, other_model = _softmax()
    page = gs.trace_divergence(other_loss, gs.compare_runs(ref, cand), model=other_model)
    ops = [n for n in page.graph.nodes if n.kind == "op"]
    assert not any(n.id in page.marks.nodes for n in ops) and page.marks.first is None
    assert page.marks.unmapped == page.marks.measured > 0


def test_the_page_carries_the_errors_and_the_first_divergence():
    ref, cand, loss, model = _softmax()
    page = gs.trace_divergence(loss, gs.compare_runs(ref, cand), model=model)
    data = embedded_data(page.to_html(title="t"))
    num = data["numerics"]
    first = data["nodes"][num["first"]]
    assert first[1] == "ExpBackward0" and num["ok"] is False
    assert num["summary"].startswith("First divergence: aten.exp (forward)")
    assert [b[0] for b in num["scale"]][-1] == "not finite"
    k = {name: key for name, key, _ in data["info"]}["numerics"]
    f = data["fields"]["numerics"]
    row = first[4][k]
    assert row[f.index("error")] == "inf" and row[f.index("diverged")] == 1
    assert row[f.index("what")] == f"aten.exp (forward) at {_marked('softmax_fp16', '# over')}"


def test_old_saved_runs_without_node_numbers_still_load(tmp_path: Path):
    ref, cand, _, _ = _softmax()
    assert all(o.seq is not None for o in cand.ops if o.phase == "forward"
               and o.op != "aten.ones_like")
    doc = json.loads(cand.to_json())
    for op in doc["ops"]:
        del op["seq"]
    old = gs.NumericsRun.from_json(json.dumps(doc))
    assert all(o.seq is None for o in old.ops)
    assert [o.seq for o in gs.NumericsRun.from_json(cand.to_json()).ops] == [
        o.seq for o in cand.ops]
    assert gs.compare_runs(ref, old).first.op == "aten.exp"


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x * 30.0)


class Hostile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("<script>alert(1)</script>", nn.Sequential(nn.Linear(4, 4), Exp()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, "<script>alert(1)</script>")(x)


def test_a_hostile_module_name_stays_data():
    model, x = Hostile(), torch.randn(3, 4)
    runs, losses = [], []
    for dtype in (torch.float32, torch.float16):
        m = copy.deepcopy(model).to(dtype)
        with gs.record_numerics(m) as run:
            loss = m(x.to(dtype)).float().sum()
            loss.backward()
        runs.append(run)
        losses.append((loss, m))
    d = gs.compare_runs(*runs)
    assert not d.ok and d.first.module == "<script>alert(1)</script>.1"
    page = gs.trace_divergence(losses[1][0], d, model=losses[1][1]).to_html()
    assert "<script>alert" not in page  # every < of the data is \u003c
    data = embedded_data(page)
    assert "<script>alert(1)</script>" in data["numerics"]["summary"]


@pytest.fixture
def invoke(capsys, monkeypatch):
    """The console script's entry point, in process, at 120 columns."""
    return in_process_cli(capsys, monkeypatch, 120)


def test_compare_writes_the_page(invoke, tmp_path: Path):
    out = tmp_path / "d.html"
    code, _, err = invoke("compare", str(NUMERICS / "softmax_fp16.py"), "--candidate", "fp16",
                          "--html", str(out))
    assert code == 1  # the exit code of compare, page or not
    assert re.search(r"wrote .*d\.html: \d+ of \d+ nodes coloured by their error, first "
                     r"divergence at n\d+ \(ExpBackward0\)", " ".join(err.split()))
    data = embedded_data(out.read_text())
    assert data["nodes"][data["numerics"]["first"]][1] == "ExpBackward0"


def test_compare_html_with_saved_runs_is_refused(invoke, tmp_path: Path):
    ref, cand, _, _ = _softmax()
    a, b = ref.save(tmp_path / "a.json"), cand.save(tmp_path / "b.json")
    code, out, err = invoke("compare", str(a), str(b), "--html", str(tmp_path / "d.html"))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--html needs a model file" in err
    assert not (tmp_path / "d.html").exists()
    code, _, err = invoke("compare", str(NUMERICS / "softmax_fp16.py"), "--html",
                          str(tmp_path / "d.svg"))
    assert code == 2 and "d.html" not in err and ".html" in err


# ---------------------------------------------------------------------- in Chromium
@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


class Deep(nn.Module):
    """Twelve blocks; the ninth squares values near 300, which overflows float16."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh())
                                    for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i == 8:
                x = (x + 300.0) * (x + 300.0) / 1e5  # overflows in float16
        return x


def test_the_page_opens_on_the_first_divergence(browser, tmp_path: Path):
    model, x = Deep(), torch.randn(4, 8)
    runs = []
    for dtype in (torch.float32, torch.float16):
        m = copy.deepcopy(model).to(dtype)
        with gs.record_numerics(m) as run:
            loss = m(x.to(dtype)).float().square().mean()
            loss.backward()
        runs.append(run)
    d = gs.compare_runs(*runs)
    assert d.first.op == "aten.mul" and d.first.phase == "forward"
    page = gs.trace_divergence(loss, d, model=m)
    first = page.marks.first
    assert page.graph.node(first).name == "MulBackward0"
    path = page.save(tmp_path / "deep.html", max_nodes=20)  # most modules start closed
    p = Page(browser, path)
    try:
        assert p.js("gradscope.firstDivergence()") == first
        box = p.js(f"gradscope.boxAt({first!r})")  # drawn (its module opened), in view
        view = p.js("gradscope.view()")
        assert box is not None and 0 <= box["x"] and box["x"] + box["w"] <= view["width"]
        assert 0 <= box["y"] and box["y"] + box["h"] <= view["height"]
        details = p.js("gradscope.details()")
        assert "the first divergence" in details and "beyond tolerance" in details
        assert p.js("gradscope.state()")["note"].startswith(
            "Numerics against the reference: First divergence: aten.mul (forward)")
        assert p.js("gradscope.goToDivergence()") == first
        assert "◆ first divergence" in p.js("gradscope.exportSvg()")
    finally:
        p.close()
