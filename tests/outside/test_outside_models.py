"""Outside models through the command line: torchvision ResNet-50, ViT-B/16 and Faster R-CNN
(train mode, its loss dict as the output), Hugging Face Llama and T5 from small configs, a timm
ConvNeXt, and a torch.compile'd torchvision ResNet-18 (aot_eager). Weights are never
downloaded: every model is built from its config with random weights (tests/outside/models/).

Each command runs in process through typer's runner, as tests/cli/ does; it must exit 0 (1 only
where it reports a non-finite gradient) with no traceback. The graph the CLI writes is checked
against a plain BFS over ``next_functions`` of the same model file's output, written here and
knowing nothing of gradscope. These tests run on the CI leg that has torchvision and timm
(torch 2.14.1, see scripts/test.sh); elsewhere they are skipped."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torchvision", reason="the outside-model tests need torchvision "
                    "(the torch 2.14.1 leg of scripts/test.sh installs it)")

from conftest import reference_walk  # noqa: E402
from gradscope_cli.main import app  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import gradscope as gs  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
#: model file -> the import it needs beyond torchvision
FILES = {
    "resnet50": None,
    "vit_b_16": None,
    "faster_rcnn": None,
    "hf_llama": "transformers",
    "hf_t5": "transformers",
    "timm_convnext": "timm",
}
COMPILED = "compiled_resnet18"


def model_file(name: str) -> str:
    needs = FILES.get(name)
    if needs is not None:
        pytest.importorskip(needs)
    return str(MODELS / f"{name}.py")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    # anything but a SystemExit escaping the command would be a traceback for the user
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception)
    )
    out, err = result.stdout, result.stderr
    assert "Traceback" not in out + err, err[-2000:]
    return result.exit_code, out, err


# ---------------------------------------------------------------------------- ground truth
def load(name: str):
    """Import the model file as the CLI would (without gradscope) and run its forward."""
    path = MODELS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"outside_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if hasattr(mod, "build"):
        model, inputs = mod.build()
    else:
        model, inputs = mod.model, mod.example_input
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    return mod, out


def counts(graph: gs.Graph, keep=lambda n: True) -> tuple[Counter, int]:
    kinds = {"op", "custom", "accumulate"}
    ids = {n.id for n in graph.nodes if n.kind in kinds and keep(n)}
    names = Counter(n.name for n in graph.nodes if n.id in ids)
    edges = sum(1 for e in graph.edges if e.src in ids and e.dst in ids and e.kind == "grad")
    return names, edges


# ---------------------------------------------------------------------------- the commands
@pytest.mark.parametrize("name", list(FILES))
def test_render_loss_backward_matches_a_plain_walk(name, tmp_path):
    path = model_file(name)
    out = tmp_path / f"{name}.json"
    code, _, err = run("render", path, "--loss", "--backward", "-o", str(out))
    assert code in (0, 1), err  # 1: it found a non-finite gradient (none expected here)
    assert code == 0 and "all gradients finite" in err, err
    graph = gs.Graph.from_json(out.read_text())
    assert sum(1 for n in graph.nodes if n.order is not None) > 0  # backward was recorded
    mod, output = load(name)
    names, edges = reference_walk(mod.loss_fn(output))
    assert counts(graph) == (names, edges)


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("fmt", ["svg", "html"])
def test_render_writes_the_picture(name, fmt, tmp_path):
    path = model_file(name)
    out = tmp_path / f"{name}.{fmt}"
    code, _, err = run("render", path, "-o", str(out))
    assert code == 0, err
    text = out.read_text()
    assert text.lstrip().startswith("<") and len(text) > 1000
    if fmt == "svg":
        assert "</svg>" in text


@pytest.mark.parametrize("name", list(FILES))
def test_tree_prints_the_graph(name):
    path = model_file(name)
    code, out, err = run("tree", path, "--max-lines", "60")
    assert code == 0, err
    assert "AccumulateGrad" in out or "Backward" in out


# ---------------------------------------------------------------------------- compiled
@pytest.fixture
def fresh_dynamo_here():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_torchvision_model_has_its_region_expanded(tmp_path, fresh_dynamo_here):
    path = str(MODELS / f"{COMPILED}.py")
    out = tmp_path / "c.json"
    code, _, err = run("render", path, "--loss", "--backward", "-o", str(out))
    assert code == 0, err
    assert "drawn opaque" not in err and "all gradients finite" in err
    graph = gs.Graph.from_json(out.read_text())
    regions = [n for n in graph.nodes if n.compiled is not None]
    assert regions and all(r.compiled.note is None for r in regions)
    inside = [n for n in graph.nodes if n.region is not None and n.region != n.id]
    assert sum(r.compiled.ops for r in regions) == len(inside) > 100
    assert any(n.name == "aten.convolution_backward.default" for n in inside)
    # outside the regions, the graph is autograd's own
    mod, output = load(COMPILED)
    names, _ = reference_walk(mod.loss_fn(output))
    ours, _ = counts(graph, keep=lambda n: n.region is None or n.region == n.id)
    assert ours == names
    code, tree, err = run("tree", path)
    assert code == 0 and "<compiled>" in tree and "aten." in tree, err
    code, _, err = run("render", path, "-o", str(tmp_path / "c.svg"))
    assert code == 0 and "drawn opaque" not in err, err
