"""gs.record_backward / gs.record_forward against PyTorch's own ground truth: the order in which
the engine calls node pre-hooks, torch.autograd.grad, detect_anomaly's error, and .grad."""

from __future__ import annotations

import gc
import inspect
import math
import re
import warnings

import pytest
import torch
from conftest import SAMPLES, run_cli
from torch import nn

import gradscope as gs
from gradscope._torch import stamps as _stamps
from gradscope.backward import recorder as _backward

# ---------------------------------------------------------------------------- ground truth


def engine_order(roots, run) -> list[str]:
    """Names of the nodes in the order the engine calls their pre-hooks while ``run()`` runs,
    from hooks of this test's own on every node reachable over ``next_functions``."""
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    seen, stack, handles, order = set(), [t.grad_fn for t in roots], [], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        handles.append(fn.register_prehook(lambda g, n=type(fn).__name__: order.append(n)))
        stack.extend(nxt for nxt, _ in fn.next_functions)
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return order


def anomaly_name(run) -> str | None:
    """The node detect_anomaly names in "Function 'X' returned nan values", or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled" and its traceback
        try:
            with torch.autograd.detect_anomaly():
                run()
        except RuntimeError as exc:
            m = re.search(r"Function '(\w+)' returned nan values", str(exc))
            assert m, f"unexpected error: {exc}"
            return m.group(1)
    return None


def names(rec: gs.BackwardTrace) -> list[str]:
    return [s.name for s in rec.steps]


def live_recorders() -> int:
    gc.collect()
    return sum(type(o) is _backward._Recorder for o in gc.get_objects())


# ---------------------------------------------------------------------------- builders


class Bad(torch.autograd.Function):
    """A custom Function whose backward divides by its input: NaN where x == 0 and grad == 0."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 0 / x


def branchy():
    """Two paths to the loss, a reused weight, a custom Function: enough for a non-trivial order."""
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(4, 6), nn.Linear(6, 3)
    x = torch.randn(5, 4)
    h = torch.tanh(fc1(x))
    a = fc2(h).exp()
    b = fc2(h * 2).sigmoid()
    loss = (a * b).sum() + Bad.apply(h + 1).mean()
    params = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight,
              "fc2.bias": fc2.bias}
    return loss, params


def sample(name: str):
    mf = gs.load_model_file(SAMPLES / name)
    fwd = mf.forward()
    return mf.loss(fwd.outputs), fwd.model


# ---------------------------------------------------------------------------- order


def test_order_is_the_engines_pre_hook_order():
    loss, params = branchy()
    truth = engine_order(loss, lambda: loss.backward(retain_graph=True))
    with gs.record_backward(loss, params=params) as rec:
        loss.backward()
    assert names(rec) == truth
    assert "BadBackward" in truth and truth.count("AccumulateGrad") == 4
    # Node.order is the step index, and each step's id names a node of that name
    for i, step in enumerate(rec.steps):
        node = rec.graph.node(step.node_id)
        assert node.name == step.name and node.order == i


def test_order_with_autograd_grad_and_several_calls():
    loss, params = branchy()
    w = params["fc1.weight"]
    truth = engine_order(loss, lambda: torch.autograd.grad(loss, w, retain_graph=True))
    assert "AccumulateGrad" not in truth  # autograd.grad does not accumulate
    with gs.record_backward(loss, params=params) as rec:
        torch.autograd.grad(loss, w, retain_graph=True)
        torch.autograd.grad(loss, w)
    assert names(rec) == truth + truth
    assert rec.graph.node(rec.steps[len(truth)].node_id).order == 0  # order: first run


@pytest.mark.parametrize("name", ["mlp.py", "custom_function.py", "transformer.py"])
def test_order_on_samples(name):
    loss, model = sample(name)
    truth = engine_order(loss, lambda: loss.backward(retain_graph=True))
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    assert names(rec) == truth


# ---------------------------------------------------------------------------- gradient norms


def vjp_norm(out: torch.Tensor, inp: torch.Tensor, grad: torch.Tensor) -> float:
    (g,) = torch.autograd.grad(out, inp, grad, retain_graph=True)
    return torch.linalg.vector_norm(g).item()


def test_edge_norms_equal_autograd_grad():
    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4)
    z = x @ w  # MmBackward0
    t = torch.tanh(z)  # TanhBackward0
    m = t * 3  # MulBackward0
    e = m.exp()  # ExpBackward0
    u = w.sin()  # w used a second time: AccumulateGrad(w) gets two edges
    loss = e.sum() + u.mean()
    with gs.record_backward(loss, params={"w": w}) as rec:
        loss.backward(retain_graph=True)
    g = rec.graph
    by_name = {n.name: n.id for n in g.nodes}
    grads = dict(zip("ztmeuw", torch.autograd.grad(loss, [z, t, m, e, u, w], retain_graph=True)))

    def edge(src: str, dst: str) -> gs.Edge:
        (hit,) = [x for x in g.edges if x.src == by_name[src] and x.dst == by_name[dst]]
        return hit

    def norm(key: str):
        return pytest.approx(torch.linalg.vector_norm(grads[key]).item(), rel=1e-6)

    assert edge("SumBackward0", "ExpBackward0").grad_norm == norm("e")
    assert edge("ExpBackward0", "MulBackward0").grad_norm == norm("m")
    assert edge("MulBackward0", "TanhBackward0").grad_norm == norm("t")
    assert edge("TanhBackward0", "MmBackward0").grad_norm == norm("z")
    # the two partial gradients into w, and their sum on the AccumulateGrad -> leaf edge
    assert edge("SinBackward0", "AccumulateGrad").grad_norm == pytest.approx(
        vjp_norm(u, w, grads["u"]), rel=1e-6)
    assert edge("MmBackward0", "AccumulateGrad").grad_norm == pytest.approx(
        vjp_norm(z, w, grads["z"]), rel=1e-6)
    assert edge("AccumulateGrad", "w").grad_norm == norm("w")
    assert torch.equal(grads["w"], w.grad)
    # the output edge carries the seed gradient, 1
    (root_edge,) = [x for x in g.edges if x.src == g.roots[0]]
    assert root_edge.grad_norm == 1.0


def test_step_stats_match_the_gradients():
    torch.manual_seed(0)
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    y = x.exp()
    loss = (y * y).sum()
    with gs.record_backward(loss, params={"x": x}) as rec:
        loss.backward()
    (acc,) = [s for s in rec.steps if s.name == "AccumulateGrad"]
    (stat,) = acc.grad_outputs
    assert acc.grad_inputs == []
    assert stat.shape == [6] and not stat.nan and not stat.inf
    assert stat.norm == pytest.approx(torch.linalg.vector_norm(x.grad).item(), rel=1e-12)
    assert stat.max_abs == pytest.approx(x.grad.abs().max().item(), rel=1e-12)
    (mul,) = [s for s in rec.steps if s.name == "MulBackward0"]
    assert len(mul.grad_inputs) == 2  # both operands are y


# ---------------------------------------------------------------------------- NaN and Inf


def where_sqrt():
    x = torch.tensor([4.0, -1.0, 9.0], requires_grad=True)
    return torch.where(x > 0, x.sqrt(), 0.0).sum(), {"x": x}


def custom_nan():
    x = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    return Bad.apply(x * 1).sum(), {"x": x}


def nan_sample():
    loss, model = sample("nan_backward.py")
    return loss, dict(model.named_parameters())


@pytest.mark.parametrize("build", [where_sqrt, custom_nan, nan_sample])
def test_first_nan_is_the_node_detect_anomaly_names(build):
    loss, params = build()
    expected = anomaly_name(lambda: build()[0].backward())
    assert expected is not None
    with gs.record_backward(loss, params=params) as rec:
        loss.backward()
    bad = rec.first_nonfinite
    assert bad is not None and bad.kind == "nan"
    assert bad.name == expected
    assert bad.slot == "grad_inputs[0]"
    node = rec.graph.node(bad.node_id)
    assert node.first_nonfinite and node.nonfinite == "nan" and "nonfinite" not in node.attrs
    # which parameters received NaN: exactly those whose .grad has NaN
    truth = [n for n, p in params.items() if p.grad is not None and p.grad.isnan().any()]
    assert sorted(rec.nonfinite_params()) == sorted(truth)


def test_inf_found_where_detect_anomaly_is_silent():
    loss, model = sample("inf_backward.py")
    assert anomaly_name(lambda: sample("inf_backward.py")[0].backward()) is None
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    bad = rec.first_nonfinite
    assert bad is not None and bad.kind == "inf" and bad.name == "AddmmBackward0"
    truth = [n for n, p in model.named_parameters() if p.grad.isinf().any()]
    assert truth and sorted(rec.nonfinite_params()) == sorted(truth)
    assert bad.slot == "grad_inputs[0]" and "grad_inputs[0] -> fc.bias" in rec.summary()
    assert model.fc.bias.grad.isinf().all()
    assert not any(s.nan for step in rec.steps for s in step.grad_inputs if s is not None)


def test_inf_sample_names_its_forward_line():
    with gs.record_forward():
        loss, model = sample("inf_backward.py")
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    assert rec.first_nonfinite.traceback.startswith("samples/inf_backward.py:")
    assert "return self.fc(x)" in rec.first_nonfinite.traceback


def test_inf_before_nan_is_reported_first():
    """sqrt(0) in backward gives Inf; the Inf * 0 that follows gives the NaN detect_anomaly
    reports one node later."""
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = torch.tensor([[1.0, 2.0], [0.0, 0.0]])

    def dist():
        return (a - b).pow(2).sum(dim=1).sqrt().sum()

    loss = dist()
    with gs.record_backward(loss) as rec:
        loss.backward()
    assert rec.first_nonfinite.name == "SqrtBackward0" and rec.first_nonfinite.kind == "inf"
    first_nan = next(s for s in rec.steps if any(g is not None and g.nan for g in s.grad_inputs))
    assert first_nan.name == anomaly_name(lambda: dist().backward()) == "PowBackward0"


def test_nan_put_on_a_leaf_by_a_tensor_hook_names_the_parameter():
    w = torch.ones(3, requires_grad=True)
    w.register_hook(lambda g: g * float("nan"))
    loss = (w * 2).sum()
    with gs.record_backward(loss, params={"weight": w}) as rec:
        loss.backward()
    bad = rec.first_nonfinite
    assert bad.name == "AccumulateGrad" and bad.param == "weight"
    assert bad.slot == "grad_outputs[0]" and bad.kind == "nan"
    assert w.grad.isnan().all()


def test_finite_backward_reports_nothing():
    loss, model = sample("mlp.py")
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    assert rec.first_nonfinite is None and rec.nonfinite_params() == []
    assert not any(n.nonfinite for n in rec.graph.nodes)
    assert "all gradients finite" in rec.summary()


# ---------------------------------------------------------------------------- no side effects


def grads_of(build, record: bool, **backward_kw):
    loss, params = build()
    if record:
        with gs.record_backward(loss, params=params):
            loss.backward(**backward_kw)
    else:
        loss.backward(**backward_kw)
    return [p.grad.clone() for p in params.values()]


@pytest.mark.parametrize("kw", [{}, {"create_graph": True}])
def test_gradients_identical_with_and_without_recorder(kw):
    plain = grads_of(branchy, False, **kw)
    recorded = grads_of(branchy, True, **kw)
    for a, b in zip(plain, recorded):
        assert torch.equal(a, b)


def test_create_graph_keeps_second_order_usable():
    x = torch.randn(4, requires_grad=True)
    y = (x**3).sum()
    with gs.record_backward(y, params={"x": x}) as rec:
        (g,) = torch.autograd.grad(y, x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    assert torch.allclose(h, 6 * x.detach())
    assert names(rec) == ["SumBackward0", "PowBackward0"]


def test_hooks_are_removed_after_the_block():
    loss, params = branchy()
    with gs.record_backward(loss, params=params) as rec:
        loss.backward(retain_graph=True)
    n = len(rec.steps)
    assert live_recorders() == 0  # nothing (no hook on the still-alive graph) holds it
    loss.backward()
    assert len(rec.steps) == n


def test_hooks_are_removed_when_the_block_raises():
    loss, params = custom_nan()
    with pytest.raises(RuntimeError, match="returned nan"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with gs.record_backward(loss, params=params) as rec:
                with torch.autograd.detect_anomaly():
                    loss.backward()
    assert live_recorders() == 0
    assert rec.first_nonfinite.name == "BadBackward"  # filled in all the same


def test_record_backward_needs_a_graph():
    with pytest.raises(gs.NoGradError):
        with gs.record_backward(torch.ones(3)):
            pass


# ---------------------------------------------------------------------------- forward lines


def line_of(fn, marker: str) -> int:
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if marker in line)


def forward_with_lines():
    x = torch.tensor([1.0, -1.0, 0.0], requires_grad=True)
    h = x * 3  # line: mul
    r = torch.where(h > 0, h.sqrt(), 0.0)  # line: sqrt
    c = Bad.apply(r + 1)  # line: custom
    return (c.sum() + r.sum()), x


def test_record_forward_names_the_line_of_each_node():
    with gs.record_forward():
        loss, x = forward_with_lines()
    with gs.record_backward(loss, params={"x": x}) as rec:
        loss.backward()
    where = {n.name: n.created_at or "" for n in rec.graph.nodes}
    for node, marker in [("MulBackward0", "# line: mul"), ("SqrtBackward0", "# line: sqrt"),
                         ("BadBackward", "# line: custom")]:
        line = line_of(forward_with_lines, marker)
        assert re.match(rf".*test_backward\.py:{line}: ", where[node]), where[node]
        assert marker in where[node]
    bad = rec.first_nonfinite
    assert bad.name == "SqrtBackward0" and "# line: sqrt" in bad.traceback
    assert "created_at" not in rec.graph.node(next(
        n.id for n in rec.graph.nodes if n.kind == "accumulate")).attrs


def test_record_forward_points_into_the_model_file():
    with gs.record_forward():
        loss, model = sample("nan_backward.py")
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    text = (SAMPLES / "nan_backward.py").read_text().splitlines()
    line = next(i for i, s in enumerate(text, 1) if "# forward finite, backward NaN" in s)
    expected = f"samples/nan_backward.py:{line}: {text[line - 1].strip()}"
    assert rec.first_nonfinite.traceback == expected
    assert "created at samples/nan_backward.py" in rec.summary()


def test_torch_modules_run_by_gradscope_get_no_line(tmp_path):
    """A bare nn.Linear run by the loader has no user line: it must not get the caller's."""
    path = tmp_path / "bare.py"
    path.write_text(
        "import torch\nmodel = torch.nn.Linear(3, 1)\nexample_input = torch.randn(2, 3)\n"
    )
    with gs.record_forward():
        out = gs.load_model_file(path).forward().outputs
        loss = out.pow(2).sum()  # line: loss
    with gs.record_backward(loss) as rec:
        loss.backward()
    where = {n.name: n.created_at for n in rec.graph.nodes}
    assert where["AddmmBackward0"] is None
    assert "# line: loss" in where["PowBackward0"] and "# line: loss" in where["SumBackward0"]


def test_record_forward_skips_nodes_made_before_it():
    x = torch.ones(2, requires_grad=True)
    early = x * 2
    with gs.record_forward():
        late = early.exp()
    assert _stamps.CREATED_KEY in late.grad_fn.metadata
    assert _stamps.CREATED_KEY not in early.grad_fn.metadata


def test_anomaly_traceback_is_used_without_record_forward():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=False):
            loss, params = where_sqrt()
    with gs.record_backward(loss, params=params) as rec:
        loss.backward()
    assert "where_sqrt" in rec.first_nonfinite.traceback


# ---------------------------------------------------------------------------- double backward


def test_double_backward_sample_records_both_passes():
    mf = gs.load_model_file(SAMPLES / "double_backward.py")
    first, second, hv = mf.get("record_hvp")()
    w, v, loss_of = mf.get("w"), mf.get("v"), mf.get("loss_of")
    _, truth_hv = torch.autograd.functional.hvp(loss_of, w.detach(), v)
    assert torch.allclose(hv, truth_hv, atol=1e-6)
    # the second pass runs the nodes the first one created, in the engine's order
    loss = loss_of(w)
    (g,) = torch.autograd.grad(loss, w, create_graph=True)
    gv = (g * v).sum()
    first_truth = engine_order(loss, lambda: torch.autograd.grad(loss, w, retain_graph=True))
    assert names(first) == first_truth
    assert names(second) == engine_order(gv, lambda: torch.autograd.grad(gv, w))
    assert {"MulBackward1", "TanhBackwardBackward0", "TanhBackward0"} <= set(names(second))
    assert first.first_nonfinite is None and second.first_nonfinite is None


def test_double_backward_graph_links_second_order_to_forward_nodes():
    graph = gs.trace(gs.load_model_file(SAMPLES / "double_backward.py").get("build")())
    by_id = {n.id: n.name for n in graph.nodes}
    links = {(by_id[e.src], by_id[e.dst]) for e in graph.edges if e.kind == "grad"}
    assert ("TanhBackwardBackward0", "TanhBackward0") in links
    assert "MulBackward1" in by_id.values()


def test_sqrt_of_negative_nan_norm_is_reported_as_nan():
    loss, params = where_sqrt()
    with gs.record_backward(loss, params=params) as rec:
        loss.backward()
    edge = next(e for e in rec.graph.edges if rec.graph.node(e.src).name == "SqrtBackward0")
    assert math.isnan(edge.grad_norm)


@pytest.mark.parametrize("args", [
    ("samples/double_backward.py",), ("samples/nan_backward.py", "--loss"),
    ("samples/inf_backward.py", "--loss"),
])
def test_samples_render_through_the_cli(tmp_path, args):
    out = tmp_path / "graph.dot"
    result = run_cli("render", *args, "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    if "double" in args[0]:
        assert "MulBackward1" in text and "TanhBackwardBackward0" in text
    else:
        assert "AccumulateGrad" in text


# ---------------------------------------------------------------------------- forward NaN
def test_check_finite_names_the_first_non_finite_forward_op(monkeypatch):
    """The first op whose output held a NaN, its module and line, with no host sync per op
    (flags stay on the device) and one transfer when the block ends."""
    mf = gs.load_model_file(SAMPLES / "nan_forward.py")
    transfers = []
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: transfers.append("tolist")
                        or real_tolist(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: transfers.append("item") or real_item(t))
    with gs.record_forward(check_finite=True) as fw:
        fwd = mf.forward()
        during = list(transfers)
        loss = mf.loss(fwd.outputs)
    monkeypatch.undo()
    bad = fw.first_nonfinite
    assert during == [] and transfers == ["tolist"]
    assert bad is not None and bad.kind == "nan" and bad.node == "LogBackward0"
    assert bad.module == "mid" and bad.op == "log"
    assert bad.where.startswith("samples/nan_forward.py:") and "h.log()" in bad.where
    assert bad.summary().startswith("the forward already produced nan at LogBackward0 in mid")
    # ground truth: the same forward, op by op, by hand
    h = fwd.model.mid.lin(torch.relu(fwd.model.inp(mf.get("example_input"))))
    assert torch.isfinite(h).all() and not torch.isfinite(h.log()).all()
    with gs.record_backward(loss, model=fwd.model) as rec:
        loss.backward()
    marked = [n for n in rec.graph.nodes if n.forward_nonfinite]
    assert [(n.name, n.module, n.forward_nonfinite) for n in marked] == [
        ("LogBackward0", "mid", "nan")]


def test_check_finite_is_quiet_on_a_finite_forward_and_off_by_default():
    x = torch.randn(4, requires_grad=True)
    with gs.record_forward(check_finite=True) as fw:
        (x.exp() * 2).sum()
    assert fw.first_nonfinite is None
    with gs.record_forward() as fw:
        (x - 1e9).exp().log()  # -inf, but not asked for
    assert fw.first_nonfinite is None


def test_check_finite_reports_inf_and_ops_without_grad():
    x = torch.tensor([1.0, 0.0])
    with gs.record_forward(check_finite=True) as fw:
        y = 1.0 / x  # no grad: still checked
    assert fw.first_nonfinite.kind == "inf" and fw.first_nonfinite.node is None
    assert "div" in fw.first_nonfinite.op
    assert torch.isinf(y).any()


FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_float8_values_are_checked_widened(dtype):
    """float8 tensors have no ``isinf`` (e4m3fn) and no norm: the recorders read them as
    float32 (exact), so a float8 output neither raises in the user's forward nor in backward,
    and its NaN is found (issue 29 item 9)."""
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    with gs.record_forward(check_finite=True) as fw:
        out = (x @ w).to(dtype)
    assert fw.first_nonfinite is None
    g = torch.full(out.shape, 0.5).to(dtype)
    with gs.record_backward(out, params={"w": w}) as rec:
        out.backward(g)
    root = rec.steps[0].grad_outputs[0]  # the float8 gradient handed to backward
    assert root.norm == pytest.approx(torch.linalg.vector_norm(g.float()).item())
    assert root.max_abs == 0.5 and root.finite
    assert torch.isfinite(w.grad).all() and rec.first_nonfinite is None
    bits = torch.tensor([0x38, 0x7F], dtype=torch.uint8)  # 1.0 (e4m3fn) / 0.5 (e5m2), NaN
    with gs.record_forward(check_finite=True) as fw:
        bad = bits.view(dtype)  # the first floating value of the block: float8, with a NaN
    assert torch.isnan(bad.float()).tolist() == [False, True]
    assert (fw.first_nonfinite.op, fw.first_nonfinite.kind) == ("view", "nan")


def test_a_nan_in_a_tensor_the_forward_is_given_is_named_not_blamed_on_an_op():
    """The first op that reads a NaN input is not where the NaN was made (issue 29 item 15)."""
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    x[1, 2] = math.nan
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input x", x)])
        lin(x).sum()
    bad = fw.first_nonfinite
    assert (bad.input, bad.kind, bad.op, bad.node) == ("the input x", "nan", "linear", None)
    assert bad.summary().startswith("the input x already held nan before the forward ran")
    with torch.no_grad():
        lin.weight[0, 0] = math.inf
    y = torch.randn(4, 3)
    with gs.record_forward(check_finite=True) as fw:
        lin(y).sum()  # unnamed: a parameter is still said as one
    assert (fw.first_nonfinite.input, fw.first_nonfinite.kind) == ("a parameter", "inf")
    z = torch.randn(4, 3)
    with gs.record_forward(check_finite=True) as fw:
        h = z.log_()  # made NaN in the forward, in place: the op's, not the input's
        (h * 2).sum()
    assert torch.isnan(z).any()
    assert fw.first_nonfinite.input is None and fw.first_nonfinite.op == "log_"


def test_a_parameter_initialised_in_place_is_not_blamed_for_its_old_memory():
    """A parameter made by ``torch.empty`` holds whatever was in memory, NaN bits included,
    until ``nn.init`` writes over it: built inside the recorder, a module is no finding
    (the ``Embedding`` test below failed so, at random, in a clean-clone run); what the init
    writes is."""
    def garbage(*shape: int) -> nn.Parameter:  # what torch.empty may hand back, made certain
        return nn.Parameter(torch.full(shape, float("nan")))

    cases = {
        "normal_": lambda p: nn.init.normal_(p),
        "kaiming_uniform_": lambda p: nn.init.kaiming_uniform_(p, a=5 ** 0.5),  # reads dim() first
        "zeros_": lambda p: nn.init.zeros_(p),
        "eye_": lambda p: nn.init.eye_(p),  # torch.eye(..., out=p)
    }
    for name, init in cases.items():
        p = garbage(3, 4)
        with gs.record_forward(check_finite=True) as fw:
            init(p)
            (p * 2).sum()
        assert fw.first_nonfinite is None, name
        assert torch.isfinite(p).all()
    src = torch.ones(3, 4)
    p = garbage(3, 4)
    with gs.record_forward(check_finite=True) as fw:
        with torch.no_grad():
            p.copy_(src)
        (p * 2).sum()
    assert fw.first_nonfinite is None
    out = torch.full((2,), float("nan"))  # the out= of a call is written, not read
    with gs.record_forward(check_finite=True) as fw:
        torch.add(torch.ones(2), 1.0, out=out)
        (out * 2).sum()
    assert fw.first_nonfinite is None and out.tolist() == [2.0, 2.0]
    # a NaN that is read is still found: added to, not written over
    p = garbage(3, 4)
    with gs.record_forward(check_finite=True) as fw:
        with torch.no_grad():
            p.add_(1.0)
        (p * 2).sum()
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("a parameter", "add_")
    # written over only after a read: the read finds it
    p = garbage(3, 4)
    with gs.record_forward(check_finite=True) as fw:
        (p * 2).sum()
        nn.init.normal_(p)
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("a parameter", "mul")
    # what the init writes is checked: a NaN written is the init's
    p = garbage(3, 4)
    with gs.record_forward(check_finite=True) as fw:
        nn.init.constant_(p, float("nan"))
    assert fw.first_nonfinite.op == "constant_" and fw.first_nonfinite.input is None


def test_a_view_made_under_no_grad_and_changed_in_place_does_not_raise_in_the_recorder():
    """``Embedding(padding_idx=...)`` zeroes its padding row through a view made under
    ``no_grad``; reading that view's ``grad_fn`` raises in torch. The recorder must not."""
    with gs.record_forward(check_finite=True) as fw:
        emb = nn.Embedding(5, 3, padding_idx=0)
        out = emb(torch.tensor([0, 1]))
    assert fw.first_nonfinite is None and out[0].abs().sum() == 0
