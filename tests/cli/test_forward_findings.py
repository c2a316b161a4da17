"""What ``render --backward`` / ``tree --backward`` find in the forward (issue 27 items 3-4,
issue 29 items 9 and 15), through the CLI in-process:

- the model is built outside the recorders: constructors that allocate with ``torch.empty``
  (here poisoned with NaN on purpose), fill a buffer with NaN and overwrite it, zero
  Embedding's padding row under ``no_grad`` (``padding_idx``), or Hugging Face models built
  from configs raise no finding and exit 0;
- a NaN the forward makes is a finding (exit 1) from ``render`` and ``tree`` as from
  ``report``, even when every gradient stays finite;
- a NaN already in the batch (or a parameter) is said as such, naming the tensor;
- a float8 output is checked (widened), not a crash blamed on the user's line.
"""

from __future__ import annotations

import contextlib
import math
import textwrap
from pathlib import Path

import pytest
import torch
from gradscope_cli.main import app
from typer.testing import CliRunner

import gradscope as gs

#: Findings the forward recorder prints (``ForwardNonFinite.summary``).
FINDINGS = ("the forward already produced", "already held")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout + result.stderr


def write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@contextlib.contextmanager
def poisoned_empty():
    """``torch.empty`` that returns NaN-filled memory (what uninitialised memory may hold), so
    a constructor that allocates with it makes NaN for sure."""
    real = torch.empty

    def empty(*args, **kwargs):
        out = real(*args, **kwargs)
        if out.is_floating_point():
            with torch.no_grad():
                out.fill_(math.nan)
        return out

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real


BUILT = """
    import math
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8, padding_idx=0)   # zeroes row 0 under no_grad
            self.w = torch.nn.Parameter(torch.empty(8, 8).fill_(math.nan))  # NaN, then:
            torch.nn.init.normal_(self.w)
            self.register_buffer("shift", torch.full((8,), math.nan))
            self.shift.zero_()                                     # overwritten before forward
            self.lin = torch.nn.Linear(8, 2)

        def forward(self, ids):
            return self.lin(self.emb(ids) @ self.w + self.shift)

    def build():
        torch.manual_seed(0)
        return Net(), torch.tensor([[0, 3, 5], [2, 0, 9]])

    def loss_fn(out):
        return out.pow(2).mean()
"""


@pytest.mark.parametrize("command", ["render", "tree"])
def test_a_model_built_in_build_raises_no_false_finding(tmp_path, command):
    f = write(tmp_path, "built.py", BUILT)
    extra = ["-o", str(tmp_path / "g.dot")] if command == "render" else []
    code, out = invoke(command, f, "--loss", "--backward", *extra)
    assert code == 0, out
    assert not any(s in out for s in FINDINGS), out
    assert "all gradients finite" in out


def test_the_built_model_and_its_gradients_are_torch_s(tmp_path):
    """Ground truth: the gradients the recorded run leaves are those of a plain run of the same
    model (the recorders changed nothing), and they are finite."""
    f = write(tmp_path, "built.py", BUILT)
    mf = gs.load_model_file(f)
    run = mf.backward()
    assert run.forward_nonfinite is None and run.trace.first_nonfinite is None
    module, ids, _ = mf.build()  # a second, plain build: same seed, same weights
    module.zero_grad()
    mf.loss(module(ids)).backward()
    recorded = {n: s.norm for n, s in _accumulated(run.trace).items()}
    for name, p in module.named_parameters():
        assert recorded[name] == pytest.approx(p.grad.norm().item(), rel=1e-5), name


def _accumulated(trace: gs.BackwardTrace) -> dict[str, gs.GradStat]:
    """Parameter name -> the gradient its AccumulateGrad received."""
    leaf_of = {e.src: e.dst for e in trace.graph.edges if e.kind == "grad"}
    steps = {s.node_id: s for s in trace.steps}
    out = {}
    for node in trace.graph.nodes:
        if node.kind == "accumulate" and node.id in steps:
            out[trace.graph.node(leaf_of[node.id]).name] = steps[node.id].grad_outputs[0]
    return out


HF = """
    import torch
    import transformers

    def build():
        torch.manual_seed(0)
        cfg = transformers.{config}({kwargs})
        model = transformers.{cls}(cfg)
        return model, {{"input_ids": torch.tensor([[1, 5, 7, 2, 0, 0]])}}

    def loss_fn(out):
        return out.{field}.float().pow(2).mean()
"""
MODELS = {
    "gpt2": ("GPT2Config", "n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8",
             "GPT2LMHeadModel", "logits"),
    "bert": ("BertConfig", "num_hidden_layers=1, num_attention_heads=2, hidden_size=16, "
             "intermediate_size=32, vocab_size=32, max_position_embeddings=8, pad_token_id=0",
             "BertModel", "last_hidden_state"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hugging_face_models_built_from_configs(tmp_path, name):
    """BERT builds ``Embedding(padding_idx=...)`` (the recorder used to exit 2 on it); every
    ``torch.empty`` of the constructors holds NaN here: no finding, exit 0."""
    pytest.importorskip("transformers")
    config, kwargs, cls, field = MODELS[name]
    f = write(tmp_path, f"hf_{name}.py", HF.format(config=config, kwargs=kwargs, cls=cls,
                                                 field=field))
    with poisoned_empty():
        code, out = invoke("tree", f, "--loss", "--backward", "--depth", "1")
    assert code == 0, out
    assert not any(s in out for s in FINDINGS), out


FORWARD_NAN = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            bad = h.log()   # NaN where h < 0
            return torch.where(h > 0, bad, torch.zeros_like(h))

    torch.manual_seed(0)
    model = Net()
    example_input = torch.randn(8, 4)

    def loss_fn(out):
        return out.sum()
"""


def test_a_masked_forward_nan_is_said_but_is_no_finding(tmp_path):
    """``torch.where`` masks the NaN: every gradient is finite (torch says so). The commands say
    where the forward made it, as the SVG and the tree draw it, and exit 0 (as ``report``
    does): a NaN that never reaches the outputs or a gradient is a pattern healthy models use
    (Hugging Face T5's log of a 0 relative position), not a problem found."""
    f = write(tmp_path, "fwd_nan.py", FORWARD_NAN)
    mf = gs.load_model_file(f)
    model, x = mf.get("model"), mf.get("example_input")
    assert torch.isnan(model.fc(x).log()).any()  # ground truth: the forward made NaN
    model.zero_grad()
    model(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    for args in (["render", f, "--loss", "--backward", "-o", str(tmp_path / "g.dot")],
                 ["tree", f, "--loss", "--backward"]):
        code, out = invoke(*args)
        assert code == 0, out
        assert "the forward already produced nan at LogBackward0" in out, out
        assert "masked later: the outputs and every gradient are finite" in out, out
        assert "fwd_nan.py:11" in out, out
    dot = (tmp_path / "g.dot").read_text()
    assert "nan first made here, in the forward" in dot
    assert "bad = h.log()" in dot  # the forward line beside it


def test_report_exits_1_for_a_forward_nan_too(tmp_path):
    """The same model trained by ``report``: one event, the same exit code. A forward NaN that
    reaches the gradients (no mask) so that the monitor sees it."""
    f = write(tmp_path, "fwd_nan.py", FORWARD_NAN.replace(
        "return torch.where(h > 0, bad, torch.zeros_like(h))", "return bad"))
    codes = [invoke("tree", f, "--loss", "--backward")[0],
             invoke("render", f, "--loss", "--backward", "-o", str(tmp_path / "g.dot"))[0],
             invoke("report", f, "--steps", "2")[0]]
    assert codes == [1, 1, 1]
    masked = write(tmp_path, "masked.py", FORWARD_NAN)  # and masked: 0 from all three
    assert [invoke("tree", masked, "--loss", "--backward")[0],
            invoke("report", masked, "--steps", "2")[0]] == [0, 0]


NAN_INPUT = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    example_input = torch.randn(16, 4)
    example_input[3, 1] = float("nan")

    def loss_fn(out):
        return out.pow(2).mean()
"""


def test_a_nan_already_in_the_batch_is_said_as_the_input_s(tmp_path):
    f = write(tmp_path, "nan_input.py", NAN_INPUT)
    code, out = invoke("tree", f, "--loss", "--backward")
    assert code == 1
    (line,) = [ln for ln in out.splitlines() if "already held" in ln]
    assert line.startswith("the input example_input already held nan before the forward ran")
    assert "AddmmBackward0" not in line  # not blamed on the first op that read it
    run = gs.load_model_file(f).backward()
    bad = run.forward_nonfinite
    assert (bad.input, bad.kind, bad.node, bad.module) == (
        "the input example_input", "nan", None, "0")  # first read by the first Linear


def test_a_nan_in_a_parameter_or_in_a_built_input_is_named(tmp_path):
    body = """
        import torch

        def build():
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
            with torch.no_grad():
                net[2].weight[0, 1] = float("{value}")
            return net, {{"input": torch.randn(2, 3)}}
    """
    f = write(tmp_path, "nan_param.py", body.format(value="inf"))
    bad = gs.load_model_file(f).backward().forward_nonfinite
    assert (bad.input, bad.kind) == ("the parameter 2.weight", "inf")
    g = write(tmp_path, "nan_kw.py", body.format(value="0").replace(
        'torch.randn(2, 3)}', 'torch.tensor([[1.0, float("nan"), 0.0]] * 2)}'))
    bad = gs.load_model_file(g).backward().forward_nonfinite
    assert bad.input == "the input build()[1]['input']"


FP8 = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).to(torch.{dtype})

    torch.manual_seed(0)
    model = Net()
    example_input = torch.randn(2, 4){poison}
"""


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_a_float8_output_is_checked_not_a_crash(tmp_path, dtype):
    """float8 has no ``isinf`` (e4m3fn) and no norm: the recorders widen it to check it."""
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    f = write(tmp_path, "fp8.py", FP8.format(dtype=dtype, poison=""))
    code, out = invoke("render", f, "--backward", "-o", str(tmp_path / "g.dot"))
    assert code == 0, out
    assert "all gradients finite" in out
    g = write(tmp_path, "fp8_nan.py", FP8.format(
        dtype=dtype, poison="\n    model.lin.bias.data[0] = float('nan')"))
    code, out = invoke("tree", g, "--backward")
    assert code == 1, out
    assert "the parameter lin.bias already held nan" in out
