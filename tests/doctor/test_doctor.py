"""The autograd doctor on its planted bugs (samples/doctor/): for every variant, the finding's
lines are the lines marked ``# doctor: VARIANT`` in the sample's source, and the error it
explains is the one torch raises for the same program without the doctor (both runs here).
Where the bug raises nothing (grad_none, the training loop), the gradients and parameters are
bitwise those of the run without the doctor."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re

import pytest
import torch
from conftest import SAMPLES

import gradscope as gs
from gradscope.doctor.findings import findings_from_json, parse_inplace, torch_error_kind

DOCTOR = SAMPLES / "doctor"
_MARK = re.compile(r"#\s*doctor:\s*([\w, ]+)")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"doctor_sample_{name}", DOCTOR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marked(name: str, variant: str) -> set[str]:
    """``file.py:NN`` of every line whose ``# doctor:`` comment names ``variant``."""
    lines = set()
    path = DOCTOR / f"{name}.py"
    for n, text in enumerate(path.read_text().splitlines(), 1):
        hit = _MARK.search(text)
        if hit and variant in [v.strip() for v in hit.group(1).split(",")]:
            lines.add(f"{path.name}:{n}")
    return lines


def run(sample, variant: str, doctored: bool):
    """The sample's program with or without the doctor: (its doctor or None, the error or
    None, the model)."""
    docs: list[gs.Doctor] = []

    def watch(model, optimizer=None):
        if not doctored:
            return contextlib.nullcontext()
        doc = gs.doctor(model, optimizer=optimizer)
        docs.append(doc)
        return doc

    try:
        model = sample.program(watch, variant)
    except RuntimeError as exc:
        return (docs[0] if docs else None), exc, None
    return (docs[0] if docs else None), None, model


def lines_of(findings) -> set[str]:
    return {line for f in findings for line in f.lines}


ERRORS = [("inplace", v) for v in load("inplace").VARIANTS] + \
    [("backward_twice", v) for v in load("backward_twice").VARIANTS] + \
    [("no_grad_fn", v) for v in load("no_grad_fn").VARIANTS] + \
    [("inplace_forward", v) for v in load("inplace_forward").VARIANTS]


@pytest.mark.parametrize(("name", "variant"), ERRORS)
def test_an_autograd_error_is_torchs_own_explained_at_the_marked_lines(name, variant):
    sample = load(name)
    _, plain, _ = run(sample, variant, doctored=False)
    assert plain is not None and not isinstance(plain, gs.GradscopeError)
    assert torch_error_kind(str(plain)) == name
    doc, err, _ = run(sample, variant, doctored=True)
    assert isinstance(err, gs.AutogradError)
    assert isinstance(err, RuntimeError) and isinstance(err, gs.GradscopeError)
    assert err.torch_message == str(plain)  # torch's own message, whole
    assert str(err).splitlines()[0] == str(plain).splitlines()[0]
    assert [f.kind for f in doc.findings] == [name]
    finding = doc.findings[0]
    assert err.finding is finding and finding.torch_error == str(plain).splitlines()[0]
    assert set(finding.lines) == marked(name, variant), finding
    assert finding.line in marked(name, variant) and finding.fix


def test_the_inplace_finding_names_the_saver_modifier_and_versions():
    doc, err, _ = run(load("inplace"), "view", doctored=True)
    f = doc.findings[0]
    assert f.op == "zero_" and [s.role for s in f.sites] == ["modified", "saved"]
    assert f.sites[1].op == "sigmoid"
    assert "through a view" in f.message and "version 0" in f.message
    parsed = parse_inplace(str(err))
    assert parsed is not None and parsed.shape == (16, 8) and (parsed.expected,
                                                               parsed.found) == (0, 1)


def test_backward_twice_names_the_carried_tensor_and_its_iteration():
    doc, _, _ = run(load("backward_twice"), "state", doctored=True)
    f = doc.findings[0]
    assert [s.role for s in f.sites] == ["made", "used", "freed"]
    assert "iteration 1" in f.message and "iteration 2" in f.message
    assert "detach" in f.fix
    assert f.module == ""  # the root module's own op (scopes' convention)
    again, _, _ = run(load("backward_twice"), "again", doctored=True)
    assert "retain_graph=True" in again.findings[0].fix


GRAD_NONE = {"cut": "cut", "argmax": "cut", "no_grad": "no_grad", "unused": "unused",
             "never_called": "unused", "frozen_upstream": "frozen_upstream"}


@pytest.mark.parametrize("variant", list(GRAD_NONE))
def test_each_parameter_without_a_gradient_says_why_at_the_marked_line(variant):
    sample = load("grad_none")
    doc, err, model = run(sample, variant, doctored=True)
    assert err is None
    missing = sorted(n for n, p in model.named_parameters() if p.grad is None)
    assert missing  # the planted bug: torch gives these no gradient
    assert sorted(f.param for f in doc.findings) == missing  # one finding per parameter
    assert {(f.kind, f.reason) for f in doc.findings} == {("grad_none", GRAD_NONE[variant])}
    assert lines_of(doc.findings) == marked("grad_none", variant)
    _, _, plain = run(sample, variant, doctored=False)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("variant", load("training_loop").VARIANTS)
def test_training_loop_slips_are_found_at_the_marked_lines(variant):
    sample = load("training_loop")
    doc, err, model = run(sample, variant, doctored=True)
    assert err is None
    assert [f.kind for f in doc.findings] == [variant]
    assert lines_of(doc.findings) == marked("training_loop", variant)
    assert doc.steps == 2 and doc.backwards == 2
    _, _, plain = run(sample, variant, doctored=False)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or
                                                         torch.equal(p.grad, q.grad)), name


def test_findings_round_trip_through_json():
    doc, _, _ = run(load("inplace"), "hook", doctored=True)
    assert findings_from_json(doc.findings_json()) == doc.findings
    assert doc.report().findings == tuple(doc.findings)


def test_a_healthy_step_has_no_findings_and_equal_gradients():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin.load_state_dict(net.state_dict())
    x = torch.randn(32, 8)
    opt = torch.optim.AdamW(net.parameters())
    opt2 = torch.optim.AdamW(twin.parameters())
    with gs.doctor(net, optimizer=opt) as doc:
        for _ in range(3):
            opt.zero_grad()
            out = net(x)
            out.pow(2).mean().backward()
            opt.step()
    for _ in range(3):
        opt2.zero_grad()
        out2 = twin(x)
        out2.pow(2).mean().backward()
        opt2.step()
    assert doc.findings == [] and doc.report().healthy
    assert torch.equal(out, out2)
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)


def test_other_errors_pass_through_unchanged_and_hooks_are_removed():
    net = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        with gs.doctor(net):
            net(torch.randn(3, 5))
    assert not isinstance(info.value, gs.GradscopeError)
    assert torch._C._len_torch_function_stack() == 0
    from torch.nn.modules import module

    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    with pytest.raises(gs.GradscopeError, match="nn.Module"):
        gs.doctor("not a model")


def test_a_cut_through_a_python_number_keeps_its_lineage():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    x = torch.randn(8, 4)
    with gs.doctor(net) as doc:
        scale = net[0](x).mean().item()  # the first layer only through a float
        (net[1](x) * scale).sum().backward()
    assert {(f.param, f.reason) for f in doc.findings} == {("0.weight", "cut"),
                                                           ("0.bias", "cut")}
    assert all(f.op == "item" for f in doc.findings)


def test_intended_gradient_accumulation_is_no_finding():
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with gs.doctor(net, optimizer=opt) as doc:
        for step in range(4):  # two micro-batches per step, zero_grad after each step
            net(torch.randn(2, 4)).sum().backward()
            if step % 2:
                opt.step()
                opt.zero_grad()
    assert doc.findings == []


def test_a_compiled_module_is_one_call_no_recompile(fresh_dynamo):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(net, backend="eager")
    x = torch.randn(4, 8)
    compiled(x).sum().backward()
    graphs = counters["stats"]["unique_graphs"]
    net.zero_grad()
    with gs.doctor(net) as doc:
        out = compiled(x)
        out.sum().backward()
    assert doc.findings == [] and counters["stats"]["unique_graphs"] == graphs  # no recompile
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    compiled(x).sum().backward()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, net.parameters()))
    net.zero_grad()
    with gs.doctor(net) as doc:
        cut = compiled(x).detach() * net[0](x)[:, :4]  # the region's parameters: through it
        cut.sum().backward()
    line = f"test_doctor.py:{inspect.currentframe().f_lineno - 2}"
    assert {(f.param, f.reason, f.line) for f in doc.findings} == {
        ("2.weight", "cut", line), ("2.bias", "cut", line)}


class _CutBlock(torch.nn.Module):
    """A block that cuts its path inside, with a dropout and a BatchNorm (RNG and buffers
    that a second run would move)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)
        self.b = torch.nn.Linear(4, 1)

    def forward(self, x, scale=None):
        h = self.norm(self.drop(self.a(x)))
        if scale is not None:
            h = h * scale
        return self.b(h.detach())  # the cut, inside the compiled region


_CUT_LINE = f"test_doctor.py:{inspect.getsourcelines(_CutBlock.forward)[1] + 4}"


def _compiled_cut_net():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), _CutBlock())
    net[1] = torch.compile(net[1], backend="eager")
    return net


def test_a_cut_inside_a_compiled_module_is_named_by_running_it_again(fresh_dynamo):
    """Inside compiled code the doctor sees nothing while the step runs (the region is one
    call): at the block's end it runs the region's module once more, uncompiled, on the same
    inputs, and names the op and line of the cut inside, the region's call line kept as a
    site. The step's outputs, gradients, RNG and buffers are those of a run without it."""
    net, plain = _compiled_cut_net(), _compiled_cut_net()
    x = torch.randn(8, 4)
    torch.manual_seed(1)
    want = plain(x)
    want.sum().backward()
    after_plain = torch.rand(3)
    torch.manual_seed(1)
    with gs.doctor(net) as doc:
        got = net(x)
        got.sum().backward()
    line = f"test_doctor.py:{inspect.currentframe().f_lineno - 2}"
    after_doctor = torch.rand(3)
    assert torch.equal(got, want) and torch.equal(after_doctor, after_plain)
    for (n, a), b in zip(plain.state_dict().items(), net.state_dict().values(), strict=True):
        assert torch.equal(a, b), n  # the BatchNorm's running statistics: one update
    for (n, p), q in zip(plain.named_parameters(), net.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or
                                                        torch.equal(p.grad, q.grad)), n
    cut = [p for p, q in net.named_parameters() if q.grad is None]  # torch's own answer
    assert cut == ["0.weight", "0.bias", "1._orig_mod.a.weight", "1._orig_mod.a.bias",
                   "1._orig_mod.norm.weight", "1._orig_mod.norm.bias"]
    # named as the user names them: no compile wrapper level (``net[1].a.weight``)
    assert {(f.param, f.reason, f.op, f.line, f.module) for f in doc.findings} == {
        (name.replace("_orig_mod.", ""), "cut", "detach", _CUT_LINE, "1") for name in cut}
    f = doc.findings[0]
    assert "inside the torch.compile'd _CutBlock at" in f.message
    assert [(s.role, s.line) for s in f.sites] == [("cut", _CUT_LINE), ("compiled", line)]


def test_a_compiled_region_called_with_keywords_runs_again_with_them(fresh_dynamo):
    net = _compiled_cut_net()
    x = torch.randn(8, 4)
    with gs.doctor(net) as doc:
        net[1](net[0](x), scale=torch.tensor(2.0)).sum().backward()
    assert {(f.reason, f.op, f.line) for f in doc.findings} == {("cut", "detach", _CUT_LINE)}
    assert len(doc.findings) == 6


def test_running_a_compiled_region_again_leaves_its_inputs_alone(fresh_dynamo):
    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            x.mul_(2)  # writes to its input
            return self.a(x).detach().sum(1)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.compile(Writes(), backend="eager"))
    x = torch.ones(2, 4)
    with gs.doctor(net) as doc:
        (net(x) * torch.ones(2, requires_grad=True)).sum().backward()
    assert torch.equal(x, torch.full((2, 4), 2.0))  # once, by the step itself
    assert {(f.reason, f.op) for f in doc.findings} == {("cut", "detach")}


def test_a_compiled_region_runs_again_under_the_autocast_of_its_call(fresh_dynamo):
    class NeedsBf16(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            if h.dtype != torch.bfloat16:  # only right under the step's autocast
                raise RuntimeError("expected bfloat16")
            return h.detach().float().sum(1)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.compile(NeedsBf16(), backend="eager"))
    with gs.doctor(net) as doc:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(torch.randn(2, 4))
        (out * torch.ones(2, requires_grad=True)).sum().backward()
    assert {(f.param, f.reason, f.op) for f in doc.findings} == {
        ("0.a.weight", "cut", "detach"), ("0.a.bias", "cut", "detach")}


def test_a_compiled_region_it_cannot_run_again_is_said_not_silent(fresh_dynamo):
    """A compiled module outside the doctor's model (its keyword inputs unseen) is not run
    again: the finding names the region and its call line, never silence."""
    net = _compiled_cut_net()
    outside = net[1]
    net[1] = torch.nn.Identity()
    x = torch.randn(8, 4)
    with gs.doctor(net) as doc:
        outside(net[0](x)).sum().backward()
    line = f"test_doctor.py:{inspect.currentframe().f_lineno - 1}"
    assert {(f.param, f.reason, f.line) for f in doc.findings} == {
        ("0.weight", "compiled", line), ("0.bias", "compiled", line)}
    assert "goes through the torch.compile'd _CutBlock at" in doc.findings[0].message


def test_tensors_it_cannot_read_never_break_the_step():
    from torch.func import grad, vmap

    net = torch.nn.Linear(4, 1)
    with gs.doctor(net) as doc:
        assert torch.equal(grad(lambda x: torch.sin(x).sum())(torch.ones(3)), torch.ones(3).cos())
        vmap(torch.sin)(torch.randn(3, 2))
        (torch.eye(3).to_sparse() * 2).to_dense()
        torch.randn(2, device="meta") * 2
        with torch.inference_mode():
            torch.ones(2).add_(1)
        z = torch.randn(3, dtype=torch.complex64, requires_grad=True)
        (z * z).abs().sum().backward()  # a backward the model takes no part in
        net(torch.randn(2, 4)).sum().backward()
    assert doc.findings == [] and doc.notes == []


def test_a_backward_that_does_not_involve_a_part_is_no_finding_for_it():
    """GAN-style: the discriminator's backward leaves the generator without gradients, the
    generator's gives them; only a parameter no backward of the block reached is a finding."""
    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    both = torch.nn.ModuleDict({"gen": gen, "disc": disc})
    with gs.doctor(both) as doc:
        disc(torch.randn(8, 4)).mean().backward()
        disc(gen(torch.randn(8, 4))).mean().backward()
    assert doc.findings == []


def _leaf_program(doctored: bool) -> tuple[RuntimeError, gs.Doctor | None]:
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    doc = gs.doctor() if doctored else contextlib.nullcontext()
    with pytest.raises(RuntimeError) as info, doc:
        y = (x * x).sum()
        x.detach().zero_()  # the leaf, changed through an alias that shares its version counter
        y.backward()
    return info.value, (doc if doctored else None)


def test_a_leaf_changed_through_detach_is_explained_without_a_model():
    plain, _ = _leaf_program(False)
    err, doc = _leaf_program(True)
    assert isinstance(err, gs.AutogradError) and err.torch_message == str(plain)
    f = doc.findings[0]
    here = inspect.getsourcelines(_leaf_program)
    first = here[1]
    lines = {f"test_doctor.py:{first + i}" for i, text in enumerate(here[0])
             if "(x * x).sum()" in text or ".zero_()" in text}
    assert set(f.lines) == lines and "a leaf tensor" in f.message and f.op == "zero_"


class _StatefulCut(torch.nn.Module):
    """A compiled block with state a second run would change: a buffer its forward reassigns
    (``self.ema = ...``), a counter, its own ``torch.Generator``, draws from Python's and
    NumPy's RNG; and a cut inside (so the doctor runs it again, uncompiled)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.gen = torch.Generator().manual_seed(7)
        self.calls = 0
        self.last = torch.zeros(())

    def forward(self, x):
        import random

        np = pytest.importorskip("numpy")
        self.ema = 0.9 * self.ema + 0.1 * x.mean(0)
        self.count = self.count + 1
        self.calls += 1
        self.last = x.detach().mean()
        noise = torch.rand(4, generator=self.gen) + random.random() + float(np.random.rand())
        return (self.a(x) + noise).detach().sum(1, keepdim=True)  # the cut


def test_running_a_compiled_region_again_leaves_every_state_as_it_was(fresh_dynamo):
    """The doctor's uncompiled re-run of a compiled module (for a parameter cut inside) puts
    back what it reached: the buffers the forward reassigned (the same tensor objects again,
    bitwise), plain attributes, the module's own Generator, Python's and NumPy's RNG, torch's
    RNG."""
    import random

    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    block = _StatefulCut()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.compile(block, backend="eager"))
    x = torch.randn(8, 4)
    random.seed(3)
    np.random.seed(3)
    with gs.doctor(net) as doc:
        out = net(x)
        (out.sum() + net[0](x).sum() * 0).backward()
        ema, count, last = block.ema, block.count, block.last
        ema_bits, gen_state = ema.clone(), block.gen.get_state()
        py, npy, rng = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    assert [f.reason for f in doc.findings] == ["cut", "cut"]  # it did run the block again
    assert block.ema is ema and block.count is count  # the same objects, put back
    assert torch.equal(block.ema, ema_bits) and int(block.count) == 1
    assert block.last is last and block.calls == 1  # plain attributes too
    assert torch.equal(block.gen.get_state(), gen_state)
    assert random.getstate() == py and torch.equal(torch.random.get_rng_state(), rng)
    after = np.random.get_state()
    assert after[0] == npy[0] and (after[1] == npy[1]).all() and after[2:] == npy[2:]
    assert dict(block.named_buffers()) == {"ema": ema, "count": count}


def test_a_validation_forward_in_eval_before_the_step_is_no_eval_mode():
    """A validation pass in eval() without no_grad (its graph never backwarded), then
    model.train() and the training step: no eval_mode finding. The training forward itself in
    eval() still is one."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                              torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    with gs.doctor(net, optimizer=opt) as doc:
        for _ in range(2):
            net.eval()
            val = net(x).pow(2).mean()  # validation, no no_grad: its graph is dropped
            net.train()
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    assert val.requires_grad and doc.findings == []
    with gs.doctor(net, optimizer=opt) as doc:
        net.train()
        net(x).pow(2).mean()  # a forward in train mode whose graph is dropped
        net.eval()
        opt.zero_grad()
        net(x).pow(2).mean().backward()  # the step trains through eval-mode dropout
        line = f"test_doctor.py:{inspect.currentframe().f_lineno - 1}"
        opt.step()
    assert [(f.kind, f.line) for f in doc.findings] == [("eval_mode", line)]


def test_a_module_never_called_is_said_so_in_the_sample():
    doc, err, model = run(load("grad_none"), "never_called", doctored=True)
    assert err is None and [f.param for f in doc.findings] == ["aux.weight", "aux.bias"]
    for f in doc.findings:
        assert "module aux was never called in the step" in f.message, f
        assert "requires_grad" not in f.message and f.line is None


def test_reading_a_parameters_flags_is_not_using_it():
    """Reading ``p.requires_grad`` (a ``True``, the one Python object every ``keepdim=True``
    also is) neither counts as using the parameter nor hands its lineage to a later call."""
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({"aux": torch.nn.Linear(4, 4), "head": torch.nn.Linear(4, 4)})
    with gs.doctor(net) as doc:
        trainable = [n for n, p in net.named_parameters() if p.requires_grad]
        out = net["head"](torch.randn(3, 4)).sum(1, keepdim=True)
        out.sum().backward()
    assert len(trainable) == 4 and net["aux"].weight.grad is None  # torch's own answer
    assert [(f.param, f.reason) for f in doc.findings] == [("aux.weight", "unused"),
                                                           ("aux.bias", "unused")]
    assert all("module aux was never called in the step" in f.message for f in doc.findings)
