"""activation_report / plan_checkpoints, checked against measurements the planner does not make.

Ground truth: ``measure_forward`` reads the CPU allocations of a forward from the profiler
(allocation and free events matched by address: bytes allocated by the forward and still held
at its end, outputs apart). The planner counts saved tensors through saved-tensor hooks; the two
share nothing but the model. Plans are applied with real ``torch.utils.checkpoint`` wrappers,
and their gradients compared with the plain model's.
"""

from __future__ import annotations

import itertools
import resource

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.memory.activations import apply_checkpoints

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class ConvBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.bn(self.conv1(x))))


class CNN(nn.Module):
    def __init__(self, c: int = 8, n: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[ConvBlock(c) for _ in range(n)])
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(torch.tanh(self.stem(x))).mean((2, 3)))


def cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    torch.manual_seed(0)
    return CNN(), (torch.randn(4, 3, 16, 16),), lambda out: out.pow(2).mean()


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=256,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = tf.GPT2LMHeadModel(cfg)
    return model, (torch.randint(0, 256, (2, 32)),), lambda out: out.logits.pow(2).mean()


def llama(attn: str | None = None, device: str = "cpu"):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=64, use_cache=False)
    if attn:
        cfg._attn_implementation = attn
    with torch.device(device):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 256, (2, 16)).to(device)
    return model, (ids,), lambda out: out.logits.float().pow(2).mean()


def resnet():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.resnet18(weights=None, num_classes=10)
    return model, (torch.randn(2, 3, 64, 64),), lambda out: out.pow(2).mean()


FAMILIES = {"cnn": cnn, "gpt2": gpt2, "resnet": resnet}


def within(predicted: int, measured: int, tol: float = 0.05) -> bool:
    return abs(predicted - measured) <= tol * max(measured, 1)


@pytest.fixture(scope="module")
def reported():
    """``family -> (model, inputs, loss_fn, report)``, each built on first use and shared by
    the tests that only measure (measure_forward restores buffers and RNG, apply_checkpoints
    is removed): the report of a ResNet-18 is made once, not once per test."""
    cache: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in cache:
            model, inputs, loss_fn = FAMILIES[family]()
            cache[family] = (model, inputs, loss_fn,
                             gs.activation_report(model, *inputs, loss_fn=loss_fn))
        return cache[family]

    return get


# ---------------------------------------------------------------------- the baseline
@pytest.mark.parametrize("family", list(FAMILIES))
def test_total_matches_the_profiler(family, reported):
    model, inputs, loss_fn, rep = reported(family)
    measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    assert rep.total > 0
    assert within(rep.total, measured), (rep.total, measured)
    root = rep.row("")
    assert root.activation_bytes <= rep.total  # saves outside every module (the loss) apart
    assert root.recompute_flops > 0


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("part", [0, 1, 2])
def test_single_module_checkpoints_predicted_within_5_percent(family, part, reported):
    model, inputs, loss_fn, rep = reported(family)
    # every module that frees something, and a sample of the others (negative or zero); in
    # three parts (one report), each test a few seconds
    rows = [r for r in rep.rows if r.checkpoint_saves > 0]
    rows += [r for r in rep.rows if r.checkpoint_saves <= 0][:4]
    assert len(rows) >= 6
    for row in rows[part::3]:
        with apply_checkpoints(model, [row.path]):
            measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
        predicted = rep.predict([row.path])
        assert predicted == rep.total - row.checkpoint_saves
        assert within(predicted, measured), (row.path, predicted, measured)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("share", ["50%", "25%"])
def test_plans_fit_their_budget_when_applied(family, share):
    model, inputs, loss_fn = FAMILIES[family]()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    plan = gs.plan_checkpoints(model, *inputs, budget=share, loss_fn=loss_fn, report=rep)
    assert plan.modules and plan.predicted <= plan.budget
    members = [m for unit in plan.modules for m in rep.members(unit)]
    assert len(set(members)) == len(members)
    for a, b in itertools.combinations(members, 2):
        assert not b.startswith(a + ".") and not a.startswith(b + ".")
    check = plan.verify(model, *inputs, loss_fn=loss_fn)
    assert check.method == "profiler"
    assert within(plan.predicted, check.measured), (plan.predicted, check.measured)
    assert within(rep.total, check.measured_baseline)
    assert check.measured <= plan.budget * 1.05


def test_plan_beats_or_equals_every_block():
    model, inputs, loss_fn = gpt2()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    blocks = rep.blocks()
    assert blocks == ("transformer.h.0", "transformer.h.1", "transformer.h.2")
    every = rep.evaluate(blocks)
    plan = rep.plan(every.predicted)
    assert plan.predicted <= every.predicted
    assert plan.recompute_flops <= every.recompute_flops
    half = rep.plan("50%")
    assert half.recompute_flops < every.recompute_flops  # the rule is not needed everywhere


def _antichains(rep, cands):
    """Every set of candidates (modules and segments) whose modules are none inside another
    and none shared."""
    def clash(a, b):
        return any(x == y or x.startswith(y + ".") or y.startswith(x + ".")
                   for x in rep.members(a) for y in rep.members(b))

    out = []

    def grow(chosen, start):
        out.append(tuple(chosen))
        for i in range(start, len(cands)):
            if not any(clash(cands[i], c) for c in chosen):
                grow(chosen + [cands[i]], i + 1)

    grow([], 0)
    return out


def test_plan_is_optimal_on_a_small_tree():
    """The search against brute force over every set of non-nested modules and segments."""
    model, inputs, loss_fn = cnn()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    cands = [p for p in list(rep.modules) + rep.segments()
             if p and rep.checkpoint_saves(p) > 0]
    assert any(".." in c for c in cands)
    assert 8 <= len(cands) <= 24
    antichains = _antichains(rep, cands)
    for share in (0.9, 0.7, 0.5, 0.3):
        budget = int(rep.total * share)
        fits = [c for c in antichains if rep.predict(c) <= budget]
        try:
            plan = rep.plan(budget)
        except gs.BudgetError:
            assert not fits
            continue
        best = min(rep.flops(c) for c in fits)
        assert plan.recompute_flops == best, share


# ---------------------------------------------------------------------- gradients
def _grads(model, inputs, loss_fn):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss = loss_fn(out)
    loss.backward()
    return loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()
                                   if p.grad is not None}


@pytest.mark.parametrize("family", ["cnn", "gpt2", "resnet"])
def test_gradients_with_the_plan_equal_and_remove_restores(family):
    model, inputs, loss_fn = FAMILIES[family]()
    model.eval()  # dropout off, BatchNorm on its running statistics
    before_dict = {id(m): dict(m.__dict__) for m in model.modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss0, g0 = _grads(model, inputs, loss_fn)
    budget = "25%" if family == "resnet" else "50%"
    plan = gs.plan_checkpoints(model, *inputs, budget=budget, loss_fn=loss_fn)
    assert plan.modules
    if family == "resnet":  # its stem is no module: only a segment reaches 25%
        assert any(".." in unit for unit in plan.modules)
    classes = {id(m): type(m) for m in model.modules()}
    handle = plan.apply(model)
    for unit in plan.modules:
        if ".." in unit:  # a segment: its modules' classes swapped for same-named subclasses
            first = model.get_submodule(unit.partition("..")[0])
            assert type(first) is not classes[id(first)]
            assert isinstance(first, classes[id(first)])
            assert type(first).__name__ == classes[id(first)].__name__
        else:
            assert "forward" in model.get_submodule(unit).__dict__
    loss1, g1 = _grads(model, inputs, loss_fn)
    assert torch.equal(loss0, loss1)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=0, msg=name)
    handle.remove()
    handle.remove()  # idempotent
    loss2, g2 = _grads(model, inputs, loss_fn)
    assert torch.equal(loss0, loss2)
    for name in g0:
        assert torch.equal(g2[name], g0[name]), name
    assert {id(m): dict(m.__dict__) for m in model.modules()}.keys() == before_dict.keys()
    for m in model.modules():
        assert "forward" not in m.__dict__
        assert type(m) is classes[id(m)]
        assert m.__dict__.keys() == before_dict[id(m)].keys()
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_report_leaves_the_model_as_it_was():
    model, inputs, loss_fn = cnn()
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    gs.activation_report(model, *inputs, loss_fn=loss_fn, batch_scale=2)
    gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # BatchNorm's running statistics restored
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------- meta models
def test_meta_figures_equal_the_real_run():
    model, inputs, loss_fn = cnn()
    real = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    with torch.device("meta"):
        meta_model = CNN()
    meta = gs.activation_report(meta_model, *(x.to("meta") for x in inputs), loss_fn=loss_fn)
    assert meta.device == "meta"
    assert meta.total == real.total
    assert meta.rows == real.rows
    assert meta.segments() == real.segments() != []
    assert meta.plan("50%") == real.plan("50%")
    assert meta.plan("25%") == real.plan("25%")


def test_meta_transformer_equals_the_real_run():
    # eager attention: SDPA picks a different kernel (and saves other tensors) on meta
    real_model, inputs, loss_fn = llama("eager")
    meta_model, meta_inputs, _ = llama("eager", device="meta")
    real = gs.activation_report(real_model, *inputs, loss_fn=loss_fn)
    meta = gs.activation_report(meta_model, *meta_inputs, loss_fn=loss_fn)
    assert meta.total == real.total > 0
    assert meta.rows == real.rows


def test_llama_7b_shape_plans_on_meta_without_allocating_its_weights():
    tf = pytest.importorskip("transformers")
    cfg = tf.LlamaConfig(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=4096, use_cache=False)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 32000, (1, 1024), device="meta")
    plan = gs.plan_checkpoints(model, ids, budget="8GiB",
                               loss_fn=lambda out: out.logits.float().mean())
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert sum(p.numel() for p in model.parameters()) > 6.5e9
    assert grown_mib < 2048  # 27 GB of float32 weights were never allocated
    assert plan.baseline > 8 * 2**30 >= plan.predicted
    assert any(m.startswith("model.layers.") for m in plan.modules)


# ---------------------------------------------------------------------- what-ifs
def test_batch_extrapolation_matches_a_real_run_at_twice_the_batch():
    for make in (cnn, gpt2):
        model, inputs, loss_fn = make()
        rep = gs.activation_report(model, *inputs, loss_fn=loss_fn, batch_scale=2)
        doubled = tuple(torch.cat([x, x]) for x in inputs)
        real = gs.activation_report(model, *doubled, loss_fn=loss_fn)
        assert within(rep.scaled_total, real.total, 0.02), (rep.scaled_total, real.total)
        assert within(rep.scaled_total, gs.measure_forward(model, *doubled, loss_fn=loss_fn))
        by_path = {r.path: r.activation_bytes for r in real.rows}
        for row in rep.rows:
            assert within(row.scaled_bytes, by_path[row.path], 0.02), row


def test_autocast_column_matches_a_measured_autocast_run():
    model, inputs, loss_fn = gpt2()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn, autocast="bf16")
    assert rep.autocast == "bf16" and rep.autocast_total is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    assert within(rep.autocast_total, measured), (rep.autocast_total, measured)
    assert all(r.autocast_bytes is not None for r in rep.rows)


def test_fp16_autocast_column_matches_a_measured_autocast_run():
    """The fp16 what-if on the CNN (CPU autocast runs convolutions in float16 too)."""
    model, inputs, loss_fn = cnn()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn, autocast="fp16")
    assert rep.autocast == "fp16" and rep.autocast_total is not None
    with torch.autocast("cpu", dtype=torch.float16):
        measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    assert within(rep.autocast_total, measured), (rep.autocast_total, measured)
    assert rep.autocast_total < rep.total  # half-width activations where autocast casts


# ---------------------------------------------------------------------- budgets and errors
def test_budget_strings_and_impossible_budgets():
    model, inputs, loss_fn = cnn()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    assert rep.plan(rep.total).modules == ()
    assert rep.plan(f"{rep.total}B").modules == ()
    assert rep.plan("1TiB").predicted == rep.total
    smallest = rep.smallest()
    with pytest.raises(gs.BudgetError, match="smallest reachable figure is") as exc:
        gs.plan_checkpoints(model, *inputs, budget=smallest.predicted - 1, loss_fn=loss_fn,
                            report=rep)
    assert gs.format_bytes(smallest.predicted) in str(exc.value)
    assert isinstance(exc.value, gs.GradscopeError)
    for bad in ("lots", "-3MB", "2 parsecs", True):
        with pytest.raises(gs.BudgetError):
            rep.plan(bad)
    with pytest.raises(gs.BudgetError, match="nested"):
        rep.predict(["blocks", "blocks.0"])


def test_report_json_and_table_escape_module_names(tmp_path):
    from rich.console import Console

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("[red]x[/red]", nn.Linear(4, 4))

            self.add_module("1", nn.Tanh())

        def forward(self, x):
            return getattr(self, "1")(getattr(self, "[red]x[/red]")(x))

    model = Odd()
    rep = gs.activation_report(model, torch.randn(3, 4))
    console = Console(width=80, record=True)
    console.print(rep.render())
    assert "[red]x[/red]" in console.export_text()
    path = rep.write_json(tmp_path / "r.json", plan=None)
    import json

    data = json.loads(path.read_text())
    assert data["total"] == rep.total
    assert [r["path"] for r in data["rows"]] == [r.path for r in rep.rows]
    assert data["segments"] == rep.segments() == ["[red]x[/red]..1"]
    assert data["in_place"] == []


def test_sweep_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    model, inputs, loss_fn = cnn()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    sweep = rep.sweep()
    assert len(sweep) >= 3
    flops = [p.recompute_flops for p in sweep]
    held = [p.predicted for p in sweep]
    assert flops == sorted(flops) and held == sorted(held, reverse=True)
    out = rep.plot(tmp_path / "curve.png", chosen=rep.plan("50%"))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_max_recompute_keeps_large_modules_out():
    model, inputs, loss_fn = gpt2()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    every = rep.evaluate(rep.blocks())
    free = rep.plan(every.predicted)
    bounded = rep.plan(every.predicted, max_recompute=every.recompute_bytes)
    assert free.recompute_bytes > every.recompute_bytes  # one big module: a backward peak
    assert bounded.recompute_bytes <= every.recompute_bytes
    assert bounded.predicted <= every.predicted
    assert bounded.recompute_flops <= every.recompute_flops
    with pytest.raises(gs.BudgetError, match="max_recompute"):
        rep.plan(every.predicted, max_recompute=1)


# ---------------------------------------------------------------------- segments
class Chains(nn.Module):
    """Runs of sibling modules, some of which may be checkpointed as one and some not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)  # a chain
        self.skip = nn.Linear(8, 8)   # its output is used again below: b2 may not join it
        self.b2 = nn.Tanh()
        self.twice = nn.Tanh()        # called twice: in no segment
        self.d, self.e = nn.Linear(8, 8), nn.Identity()  # e hands its input back
        self.kw = nn.Linear(8, 8)     # called with a keyword argument

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c(self.b(self.a(x)))
        s = self.skip(x)
        x = self.b2(s) + s
        x = self.twice(self.twice(x))
        x = self.e(self.d(x))
        return self.kw(input=x).pow(2)


def test_segments_only_where_the_forward_chains():
    torch.manual_seed(0)
    model = Chains()
    rep = gs.activation_report(model, torch.randn(16, 8), loss_fn=lambda o: o.mean())
    chain = {p: i.chain_next for p, i in rep.modules.items() if i.chain_next}
    assert chain == {"a": "b", "b": "c", "c": "skip", "d": "e"}
    assert rep.segments() == ["a..b", "a..b..c", "a..b..c..skip", "b..c", "b..c..skip",
                              "c..skip", "d..e"]
    assert rep.members("a..b..c") == ("a", "b", "c")
    with pytest.raises(gs.BudgetError, match="no segment"):
        rep.members("skip..b2")
    with pytest.raises(gs.BudgetError, match="no module"):
        rep.members("a..nope")
    with pytest.raises(gs.BudgetError, match="twice"):
        rep.predict(["a..b", "b..c"])
    with pytest.raises(gs.BudgetError, match="nested"):
        rep.predict(["a..b", ""])


def test_segments_in_a_nested_parent_are_named_from_it():
    model, inputs, loss_fn = cnn()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    assert "blocks.0.conv1..bn" in rep.segments()
    assert "blocks.1..2..3" in rep.segments()
    assert rep.members("blocks.1..2..3") == ("blocks.1", "blocks.2", "blocks.3")
    # the run of every child of a module is the module: the search offers the module
    assert "blocks.0..1..2..3" in rep.segments()
    assert all("blocks.0..1..2..3" not in p.modules for p in rep.sweep())


def test_children_of_an_uncalled_module_list_are_planned_under_the_module_above():
    # GPT-2's blocks sit in transformer.h, a ModuleList never called (it has no row): they
    # belong to `transformer`, so no plan holds `transformer` and a module inside it (the
    # smallest plan raised "nested" when they were put under the model)
    model, inputs, loss_fn = gpt2()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    assert "transformer.h" not in rep.modules and "transformer.h.0" in rep.modules
    low = rep.smallest()
    plans = [low, *rep.sweep()]
    assert len(plans) >= 3
    for plan in plans:
        members = [m for unit in plan.modules for m in rep.members(unit)]
        for a, b in itertools.combinations(members, 2):
            assert not b.startswith(a + ".") and not a.startswith(b + "."), plan.modules
    assert low.predicted < rep.total
    with apply_checkpoints(model, low.modules):
        measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    assert within(low.predicted, measured), (low.modules, low.predicted, measured)


@pytest.mark.parametrize("family", ["cnn", "resnet"])
@pytest.mark.parametrize("part", [0, 1])
def test_segment_checkpoints_predicted_within_5_percent(family, part, reported):
    model, inputs, loss_fn, rep = reported(family)
    segments = [s for s in rep.segments() if rep.checkpoint_saves(s) > 0]
    assert len(segments) >= 5
    for seg in segments[:: max(1, len(segments) // 12)][part::2]:  # two parts, one report
        with apply_checkpoints(model, [seg]):
            measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
        assert within(rep.predict([seg]), measured), (seg, rep.predict([seg]), measured)


def test_segment_hooks_run_once_with_the_real_values_and_a_broken_chain_raises():
    torch.manual_seed(0)
    model = Chains()
    x = torch.randn(16, 8)
    seen: list[torch.Tensor] = []
    hook = model.b.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    with torch.no_grad():
        model(x)
    out0 = model(x)
    expected, seen[:] = seen[0], []
    with apply_checkpoints(model, ["a..b..c"]):
        with torch.no_grad():  # no checkpoint recompute without grad: one call, once
            out1 = model(x)
        assert len(seen) == 1 and torch.equal(seen[0], expected)
        assert torch.equal(out0, out1)
        model.b(torch.zeros(2, 8))  # called on its own, outside the run: runs as usual
        model.a(x)  # a run started outside the parent's forward: the next call is b alone
        z = torch.randn(2, 8)
        assert torch.equal(model.b(z), torch.tanh(z))
    hook.remove()
    assert type(model.b) is nn.Tanh and torch.equal(model(x), out0)


def test_modules_that_change_their_input_in_place_start_no_checkpoint():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Hardswish(inplace=True), nn.Linear(64, 64),
                          nn.Hardswish(inplace=True), nn.Linear(64, 4))
    x = torch.randn(32, 16)

    def loss_fn(out):
        return out.pow(2).mean()

    rep = gs.activation_report(model, x, loss_fn=loss_fn)
    assert [p for p, i in rep.modules.items() if i.mutates_input] == ["1", "3"]
    assert rep.checkpoint_saves("1") > 0  # it would look worth it...
    with apply_checkpoints(model, ["1"]), pytest.raises(RuntimeError, match="inplace"):
        loss_fn(model(x)).backward()  # ...but torch's checkpoint cannot recompute it
    assert not any(s.startswith(("1..", "3..")) for s in rep.segments())
    for plan in rep.sweep():
        assert not {"1", "3"} & set(plan.modules)
        assert not any(u.startswith(("1..", "3..")) for u in plan.modules)
        with apply_checkpoints(model, plan.modules):
            model.zero_grad()
            loss_fn(model(x)).backward()  # every plan the search gives runs its backward


def test_a_copy_of_a_model_with_segments_applied_is_the_plain_model():
    import copy
    import io

    torch.manual_seed(0)
    model = Chains()
    x = torch.randn(16, 8)
    out0 = model(x)
    with apply_checkpoints(model, ["a..b..c"]):
        twin = copy.deepcopy(model)
        buf = io.BytesIO()
        torch.save(model, buf)
    assert type(twin.a) is nn.Linear and type(twin.b) is nn.Tanh
    assert b"gradscope" not in buf.getvalue()  # loading needs no gradscope
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.b) is nn.Tanh
    for other in (twin, loaded):
        assert torch.equal(other(x), out0)
        with torch.no_grad():
            other.a.weight.zero_()  # its own modules, not the original's
        assert not torch.equal(other(x), out0) and torch.equal(model(x), out0)


class Sneaky(nn.Module):
    """Reads an inner output's values outside autograd: the graph cannot show that use."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        with torch.no_grad():
            scale = h.abs().mean()
        return self.c(self.b(h)) * scale


def test_verify_compares_outputs_and_catches_a_use_the_graph_cannot_see():
    torch.manual_seed(0)
    model, x = Sneaky(), torch.randn(64, 8)
    rep = gs.activation_report(model, x)
    assert "a..b" in rep.segments()  # the no_grad read leaves no trace in the graph
    from gradscope.memory.activations import as_checkpoint_plan

    bad = as_checkpoint_plan(rep.evaluate(["a..b"]))
    check = bad.verify(model, x)
    assert check.outputs_equal is False
    assert "outputs DIFFER" in check.summary()
    good = as_checkpoint_plan(rep.evaluate(["b..c"]))
    assert good.verify(model, x).outputs_equal is True


def test_verify_compares_outputs_from_the_same_rng_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Tanh(), nn.Linear(32, 4))
    model.train()  # dropout on: both runs must draw the same mask
    x = torch.randn(512, 8)
    rep = gs.activation_report(model, x)
    plan = rep.plan("50%")
    assert plan.modules
    from gradscope.memory.activations import as_checkpoint_plan

    check = as_checkpoint_plan(plan).verify(model, x)
    assert check.outputs_equal is True, plan.modules
