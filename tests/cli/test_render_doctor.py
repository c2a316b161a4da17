"""``gradscope render FILE --doctor`` (issue 30 item 3): the forward, loss and backward under
``gs.doctor``, the loss's graph traced by the doctor (``Doctor.trace``), and the finding's nodes
marked: the node that saved the tensor and the node the in-place op made, highlighted on the
page (with the finding's message and a "Go to finding" button) and labelled in the SVG; no
finding: the page says so. Exit codes as ``gradscope doctor``.

The node ids are checked against torch itself, on a run without the doctor: the saver is the
node whose backward raised (the last node whose pre-hook the engine ran before the error), the
modifier the node made at the marked in-place line (its forward traceback, recorded by
torch's anomaly mode)."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import SAMPLES, in_process_cli
from test_doctor import load, marked

import gradscope as gs
from gradscope.graph.walk import trace_with_ids
from gradscope.render import page_wire

DOCTOR = SAMPLES / "doctor"
INPLACE = load("inplace")


@pytest.fixture
def invoke(capsys, monkeypatch):
    """The console script's entry point, in process, at 80 columns."""
    return in_process_cli(capsys, monkeypatch, 80)


def _innermost_line(fn, path: str) -> int | None:
    """The line of ``path`` innermost in ``fn``'s forward traceback (anomaly mode's)."""
    stack = (fn.metadata or {}).get("traceback_")
    if not stack:
        return None
    text = "".join(stack) if isinstance(stack, list) else str(stack)
    hits = re.findall(rf'File "{re.escape(path)}", line (\d+)', text)
    return int(hits[-1]) if hits else None


def torch_truth(variant: str) -> dict[str, str]:
    """{"saved": id, "modified": id} in the graph of the sample's loss, from torch alone."""
    model, x = INPLACE.build(variant)
    was = torch.is_anomaly_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly mode warns on the error, by design
        torch.set_anomaly_enabled(True)
        try:
            loss = INPLACE.loss_fn(model(x))
        finally:
            torch.set_anomaly_enabled(was)
        graph, ids = trace_with_ids(loss, model=model)
        fired = []
        handles = [fn.register_prehook(lambda grads, fn=fn: fired.append(fn)) for fn in ids
                   if hasattr(fn, "register_prehook")]
        try:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()
        finally:
            for h in handles:
                h.remove()
    saver = fired[-1]  # the engine ran its pre-hook, then its backward raised
    path = str(DOCTOR / "inplace.py")
    lines = {int(m.rsplit(":", 1)[1]) for m in marked("inplace", variant)}
    at_saver = _innermost_line(saver, path)
    made = [fn for fn in ids if _innermost_line(fn, path) in lines - {at_saver}]
    if variant in ("input_saved", "custom_saved"):
        # the op saved the tensor as it was; the node the in-place op made is z's new
        # grad_fn, which the failing graph does not hold
        assert not made, [type(fn).__name__ for fn in made]
        return {"saved": ids[saver]}
    assert len(made) == 1, [type(fn).__name__ for fn in made]
    return {"saved": ids[saver], "modified": ids[made[0]]}


@pytest.mark.parametrize("variant", INPLACE.VARIANTS)
def test_the_finding_names_the_saver_and_the_modifier_nodes_torch_does(variant):
    model, x = INPLACE.build(variant)
    doc = gs.doctor(model)
    with pytest.raises(gs.AutogradError), doc:
        loss = INPLACE.loss_fn(model(x))
        graph = doc.trace(loss)
        loss.backward()
    (finding,) = doc.findings
    truth = torch_truth(variant)
    assert dict(finding.nodes) == truth
    names = {n.id: n.name for n in graph.nodes}
    # SigmoidBackward0, TanhBackward0..., or the custom Function's ScaleBackward
    assert names[truth["saved"]].endswith(("Backward0", "ScaleBackward"))
    # the report's labels name each node's own line
    notes = doc.report().node_notes()
    saved_line = next(s.line for s in finding.sites if s.role == "saved")
    assert saved_line in notes[truth["saved"]]
    if "modified" in truth:
        assert finding.line in notes[truth["modified"]]


def _page_data(path: Path) -> dict:
    """The page's data: its header block, with the node blocks joined in order."""
    page = path.read_text()
    m = re.search(r'<script type="application/json" id="gs-data">(.*?)</script>', page, re.S)
    assert m, "no embedded graph data"
    data = json.loads(m.group(1))
    blocks = re.findall(r'<script type="application/json" class="gs-part" '
                        r'data-kind="(\w+)">(.*?)</script>', page, re.S)
    data["nodes"] = page_wire.decode([(k, json.loads(b)) for k, b in blocks])["nodes"]
    assert len(data["nodes"]) == data["n_nodes"]
    return data


def test_render_doctor_marks_the_nodes_on_the_page_and_exits_1(invoke, tmp_path: Path):
    out = tmp_path / "g.html"
    code, _, err = invoke("render", str(DOCTOR / "inplace.py"), "--doctor", "-o", str(out))
    assert code == 1 and "doctor: 1 finding (1 inplace)" in err
    data = _page_data(out)
    ids = [row[0] for row in data["nodes"]]
    (f,) = data["doctor"]["findings"]
    assert f["title"] == "inplace at inplace.py:30" and "modified it in place" in f["message"]
    marked_nodes = {role: ids[i] for role, i in f["nodes"]}
    assert marked_nodes == torch_truth("view")  # the file's default variant
    labelled = {row[0] for row in data["nodes"] if len(row) > 4 and row[4] and "doc" in row[4]}
    assert labelled == set(marked_nodes.values())


def test_a_healthy_file_says_so_and_exits_0(invoke, tmp_path: Path):
    out = tmp_path / "g.html"
    code, _, err = invoke("render", str(DOCTOR / "healthy.py"), "--doctor", "-o", str(out))
    assert code == 0 and "doctor: healthy" in err
    data = _page_data(out)
    assert data["doctor"]["findings"] == [] and data["doctor"]["verdict"].startswith("healthy")
    assert not any(len(row) > 4 and row[4] and "doc" in row[4] for row in data["nodes"])


def test_no_graph_to_draw_prints_the_finding_and_exits_1(invoke, tmp_path: Path):
    out = tmp_path / "g.html"
    code, _, err = invoke("render", str(DOCTOR / "no_grad_fn.py"), "--doctor", "-o", str(out))
    assert code == 1 and "no_grad_fn at no_grad_fn.py:47" in err
    assert not out.exists()


def test_doctor_and_backward_together_is_one_line_and_exit_2(invoke, tmp_path: Path):
    code, _, err = invoke("render", str(DOCTOR / "inplace.py"), "--doctor", "--backward",
                          "-o", str(tmp_path / "g.html"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--doctor" in err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_the_svg_labels_the_saver_and_the_modifier(invoke, tmp_path: Path):
    out = tmp_path / "g.svg"
    code, _, _ = invoke("render", str(DOCTOR / "inplace.py"), "--doctor", "-o", str(out))
    assert code == 1
    svg = out.read_text()
    truth = torch_truth("view")
    groups = {m.group(1): m.group(2) for m in re.finditer(
        r'<g id="node\d+" class="node">\s*<title>([^<]+)</title>(.*?)</g>', svg, re.S)}
    assert "modified in place here: zero_ at inplace.py:30" in groups[truth["modified"]]
    assert "saved the tensor here: sigmoid at inplace.py:29" in groups[truth["saved"]]
    others = [k for k, v in groups.items() if "here:" in v and k not in truth.values()]
    assert others == []
