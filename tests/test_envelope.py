"""One envelope for every JSON document gradscope writes: each starts with ``"gradscope"``
(an int, the version of its kind) and ``"kind"``; NaN and Inf are the strings ``"nan"``,
``"inf"``, ``"-inf"`` (strict JSON: no bare NaN); documents written before the envelope read."""

from __future__ import annotations

import json
import math

import pytest
import torch

import gradscope as gs
from gradscope.doctor.findings import findings_from_json
from gradscope.output.envelope import KINDS, open_document


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _documents(tmp_path) -> dict[str, str]:
    model, x = _model(), torch.randn(16, 4)
    docs = {
        "graph": gs.trace(model(x).sum(), model=model).to_json(),
        "activations": gs.activation_report(model, x).to_json(),
        "step_memory": gs.step_memory(model, x).to_json(),
    }
    doc = gs.doctor(model)
    with doc:
        model(x).square().mean().backward()
    docs["doctor"] = doc.report().to_json()
    handle = model[0].weight.register_hook(lambda g: g * float("nan"))  # written as "nan"
    with gs.GradMonitor(model) as mon:
        model(x).square().mean().backward()
    handle.remove()
    path = mon.to_jsonl(tmp_path / "m.jsonl")
    docs["monitor"] = path.read_text().splitlines()[0]
    with gs.record_numerics(model) as run:  # a NaN in the input: "nan" in the sketches
        model(torch.full((2, 4), float("nan"))).sum().backward()
    docs["numerics"] = run.save(tmp_path / "run.json").read_text()
    docs["numerics_compare"] = gs.compare_runs(run, run).to_json()
    return docs


def _no_bare_nonfinite(text: str) -> None:
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in a document"))


def test_every_document_starts_with_the_envelope(tmp_path):
    docs = _documents(tmp_path)
    assert set(docs) == set(KINDS)  # every kind has a writer here
    for kind, text in docs.items():
        data = json.loads(text)
        assert list(data)[:2] == ["gradscope", "kind"], (kind, list(data)[:3])
        assert type(data["gradscope"]) is int and data["gradscope"] == KINDS[kind]
        assert data["kind"] == kind
        _no_bare_nonfinite(text)
        assert open_document(data, kind)["kind"] == kind


def test_nan_is_one_string_everywhere(tmp_path):
    monitor = json.loads(_documents(tmp_path)["monitor"])
    graph = gs.Graph.from_json(gs.trace(torch.tensor([1.0], requires_grad=True).sum()).to_json())
    assert graph.to_dict()["kind"] == "graph"
    norms = [s["norm"] for s in monitor["params"].values()]
    assert "nan" in norms  # not null, as before the envelope
    back = gs.read_jsonl(tmp_path / "m.jsonl")
    assert math.isnan(back.steps[0].params["0.weight"].norm)


def test_documents_from_before_the_envelope_still_read():
    old_doctor = json.dumps({"gradscope_doctor": 1, "findings": []})
    assert findings_from_json(old_doctor) == []
    with pytest.raises(gs.SchemaError, match="not step_memory"):
        open_document({"gradscope": 2, "kind": "doctor"}, "step_memory")
    with pytest.raises(gs.SchemaError, match="upgrade gradscope"):
        open_document({"gradscope": 99, "kind": "doctor"}, "doctor")
