"""The typed format registry (each format says its kind and whether it can be written here; the
CLI dispatches on the kind) and the library work the CLI calls through the public API:
``gs.trace_backward``, ``ModelFile.backward()`` and ``ModelFile.training()``, checked against
PyTorch's own gradients and optimizer."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch
from conftest import SAMPLES
from gradscope_cli.main import app, main
from typer.testing import CliRunner

import gradscope as gs
from gradscope.output import formats

MLP = str(SAMPLES / "mlp.py")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


# ---------------------------------------------------------------------------- the registry
def test_every_format_declares_its_kind_and_availability():
    kinds = {name: gs.format_spec(name).kind for name in gs.FORMATS}
    assert kinds == {
        "dot": gs.FormatKind.PICTURE, "svg": gs.FormatKind.PICTURE,
        "png": gs.FormatKind.PICTURE, "pdf": gs.FormatKind.PICTURE,
        "html": gs.FormatKind.PAGE, "json": gs.FormatKind.DATA,
    }
    for name in gs.FORMATS:
        assert gs.format_spec(name).available() in (True, False)
    assert gs.format_spec("svg").available() == (shutil.which("dot") is not None)
    assert gs.format_spec("json").available() and gs.format_spec("html").available()


def test_graphviz_availability_is_no_renderer():
    with pytest.raises(gs.FormatError):
        formats.renderer("graphviz_available")


def test_a_missing_graphviz_is_the_formats_own_error(monkeypatch):
    from gradscope.render import graphviz

    monkeypatch.setattr(graphviz.shutil, "which", lambda name: None)
    assert not gs.format_spec("png").available()
    with pytest.raises(gs.GraphvizNotFoundError, match="apt-get install graphviz"):
        gs.format_spec("png").require()
    assert gs.Graph()._repr_svg_() is None


def _counting(graph, **options) -> bytes:
    return json.dumps({"nodes": len(graph.nodes), "options": sorted(options)}).encode()


@pytest.mark.parametrize("kind", list(gs.FormatKind))
def test_the_cli_dispatches_on_the_kind_not_on_the_options(monkeypatch, tmp_path, kind):
    """A new format that takes the picture options (``saved``, ``legend``) but says it is data
    gets every node (the options used to decide: it would have been drawn as a bounded view);
    the same format said to be a picture gets the bounded view."""
    monkeypatch.setitem(formats._FORMATS, "counted", formats.OutputFormat(
        "counted", _counting, frozenset({"saved", "legend"}), kind=kind))
    fwd = gs.load_model_file(SAMPLES / "transformer.py").forward()
    every = len(gs.trace(fwd.outputs, model=fwd.model).nodes)
    assert every > 20
    out = tmp_path / "g.counted"
    code, _, err = invoke("render", str(SAMPLES / "transformer.py"), "-o", str(out),
                          "--max-nodes", "10")
    assert code == 0, err
    written = json.loads(out.read_text())
    if kind is gs.FormatKind.PICTURE:
        assert written["nodes"] < every and "drew" in err
        assert written["options"] == ["legend", "saved"]
    elif kind is gs.FormatKind.PAGE:
        assert written["nodes"] == every and written["options"] == ["saved"]
    else:
        assert written["nodes"] == every and written["options"] == []


def test_an_unavailable_format_is_refused_before_the_model_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(formats._FORMATS, "never", formats.OutputFormat(
        "never", _counting, kind=gs.FormatKind.DATA, available=lambda: False,
        unavailable=lambda name: gs.FormatError(f"{name} needs a thing; install it")))
    mark = tmp_path / "ran.txt"
    (tmp_path / "m.py").write_text(textwrap.dedent(f"""
        import pathlib, torch
        pathlib.Path({str(mark)!r}).write_text("ran")
        model = torch.nn.Linear(2, 2)
        example_input = torch.randn(1, 2)
    """))
    with pytest.raises(SystemExit) as exit_info:
        main(["render", str(tmp_path / "m.py"), "-o", str(tmp_path / "g.never")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "gradscope: error: never needs a thing; install it\n"
    assert not mark.exists() and not (tmp_path / "g.never").exists()


# ---------------------------------------------------------------------------- trace_backward
def test_trace_backward_gives_torchs_gradients_and_an_annotated_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    x = torch.randn(5, 4)
    expected = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    rec = gs.trace_backward(model(x), model=model)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)
    assert rec.first_nonfinite is None
    assert {s.name for s in rec.steps} >= {"AddmmBackward0", "TanhBackward0", "AccumulateGrad"}
    ran = [n for n in rec.graph.nodes if n.order is not None]
    assert len(ran) == len(rec.steps)  # the graph carries the engine order
    assert all(e.grad_norm is not None for e in rec.graph.edges if e.kind == "grad"
               and rec.graph.node(e.src).order is not None)


def test_trace_backward_finds_the_first_nan_and_names_the_parameter():
    x = torch.tensor([4.0, -1.0], requires_grad=True)
    rec = gs.trace_backward(x.sqrt(), params={"x": x})
    assert rec.first_nonfinite.name == "SqrtBackward0"
    assert x.grad.isnan().tolist() == [False, True]


def test_model_file_backward_says_a_forward_nan_first():
    run = gs.load_model_file(SAMPLES / "nan_backward.py").backward()
    assert isinstance(run, gs.BackwardRun)
    assert run.trace.first_nonfinite is not None
    ok = gs.load_model_file(MLP).backward()
    assert ok.forward_nonfinite is None and ok.trace.first_nonfinite is None
    assert ok.trace.graph.nodes


def test_model_file_backward_turns_a_backward_error_into_one_line(tmp_path):
    (tmp_path / "bad.py").write_text(textwrap.dedent("""
        import torch
        class Broken(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2
            @staticmethod
            def backward(ctx, g):
                return g, g   # one gradient too many
        def build():
            x = torch.randn(3, requires_grad=True)
            return Broken.apply(x).sum()
    """))
    with pytest.raises(gs.ModelFileError, match="backward raised RuntimeError"):
        gs.load_model_file(tmp_path / "bad.py").backward()


# ---------------------------------------------------------------------------- training
TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
example_input = torch.randn(8, 3)
example_target = torch.randn(8, 1)
def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)
"""


def test_training_steps_like_a_plain_sgd_loop(tmp_path):
    (tmp_path / "t.py").write_text(TRAIN)
    training = gs.load_model_file(tmp_path / "t.py").training()
    assert isinstance(training, gs.Training)
    assert isinstance(training.optimizer, torch.optim.SGD)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(training.model.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=1e-2)
    for _ in range(3):
        batch = training.next_batch()
        assert batch is not None
        training.step(batch)
        inputs, target = batch
        opt.zero_grad()
        torch.nn.functional.mse_loss(reference(inputs), target).backward()
        opt.step()
    for got, want in zip(training.model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_training_refuses_a_file_without_loss_fn(tmp_path):
    (tmp_path / "t.py").write_text(TRAIN.replace("def loss_fn", "def not_loss_fn"))
    with pytest.raises(gs.ReportError, match="defines no loss_fn"):
        gs.load_model_file(tmp_path / "t.py").training()
