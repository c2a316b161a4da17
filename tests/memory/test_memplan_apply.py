"""Applied checkpoint plans leave training as it was (issue 29, items 6, 7, 8, 26) and the
planner's prediction holds where a module's arguments hold tensors (issue 27, GPT-2's cache).

Ground truth: the plain model run from the same RNG state and buffers (BatchNorm's running
statistics, ``num_batches_tracked``), torch's own ``checkpoint`` (which updates them twice),
``pickle``'s bytes, and the profiler's measurement (``measure_forward``).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.memory.activations import apply_checkpoints, as_checkpoint_plan

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.conv, self.bn, self.act = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Tanh()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn(self.conv(self.block(self.stem(x)))))
        return self.head(x.mean((2, 3)))


def _train_step(model: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], ...]:
    model.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return [b.clone() for b in model.buffers()], grads


PLANS = [["block"], ["conv..bn..act"], ["block.0..1..2", "bn"]]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_batchnorm_buffers_stay_exact_under_a_plan(plan):
    torch.manual_seed(0)
    model, x = ConvBN().train(), torch.randn(4, 3, 8, 8)
    start = copy.deepcopy(model.state_dict())
    bufs0, grads0 = _train_step(model, x)
    model.load_state_dict(start)
    with apply_checkpoints(model, plan):
        bufs1, grads1 = _train_step(model, x)
    assert model.bn.num_batches_tracked.item() == 1
    for a, b in zip(bufs0 + grads0, bufs1 + grads1, strict=True):
        assert torch.equal(a, b)


def test_torch_checkpoint_alone_updates_batchnorm_twice_and_verify_sees_it():
    """The defect the plans avoid, shown with torch's own checkpoint: the recomputation
    updates the statistics a second time; verify() compares buffers."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model, x = ConvBN().train(), torch.randn(4, 3, 8, 8)
    checkpoint(model.block, model.stem(x), use_reentrant=False).sum().backward()
    assert model.block[1].num_batches_tracked.item() == 2  # torch's behaviour
    model = ConvBN().train()
    rep = gs.activation_report(model, x, loss_fn=lambda o: o.pow(2).mean())
    check = as_checkpoint_plan(rep.evaluate(["block"])).verify(
        model, x, loss_fn=lambda o: o.pow(2).mean())
    assert check.buffers_equal is True and check.outputs_equal is True and check.equal
    assert model.block[1].num_batches_tracked.item() == 0  # verify left the model as it was


def test_verify_reports_buffers_that_differ(monkeypatch):
    """With the buffer restoration switched off, verify() says the buffers differ."""
    import contextlib

    from gradscope.memory import checkpoint_apply as memplan_apply

    monkeypatch.setattr(memplan_apply, "_buffers_kept", lambda mods: contextlib.nullcontext())
    torch.manual_seed(0)
    model, x = ConvBN().train(), torch.randn(4, 3, 8, 8)
    rep = gs.activation_report(model, x)
    check = as_checkpoint_plan(rep.evaluate(["block"])).verify(model, x)
    assert check.buffers_equal is False and not check.equal
    assert "buffers DIFFER" in check.summary()


def _plain(model: nn.Module, classes: dict[str, type]) -> bool:
    return all(type(m) is classes[n] and "forward" not in m.__dict__
               for n, m in model.named_modules())


@pytest.mark.parametrize("order", ["as applied", "reversed"])
def test_two_plans_removed_in_any_order_restore_the_model(order):
    torch.manual_seed(0)
    model, x = ConvBN().train(), torch.randn(4, 3, 8, 8)
    classes = {n: type(m) for n, m in model.named_modules()}
    first = apply_checkpoints(model, ["block", "conv..bn..act"])
    second = apply_checkpoints(model, ["block", "conv..bn..act", "head"])
    handles = [first, second] if order == "as applied" else [second, first]
    handles[0].remove()
    # the other plan still checkpoints them
    assert "forward" in model.block.__dict__ and type(model.bn) is not nn.BatchNorm2d
    model(x).sum().backward()
    handles[1].remove()
    assert _plain(model, classes)
    handles[0].remove()  # idempotent
    assert _plain(model, classes)


def test_an_overlapping_segment_is_refused_and_the_model_left_as_it_was():
    model = ConvBN()
    classes = {n: type(m) for n, m in model.named_modules()}
    with apply_checkpoints(model, ["conv..bn..act"]):
        with pytest.raises(gs.GradscopeError, match="overlaps"):
            apply_checkpoints(model, ["bn..act"])
    assert _plain(model, classes)


def test_a_pickled_model_with_a_module_plan_loads_without_gradscope(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.BatchNorm2d(8), nn.ReLU()),
                          nn.Conv2d(8, 8, 3), nn.Tanh(), nn.Flatten()).eval()
    x = torch.randn(2, 3, 8, 8)
    out = model(x)
    path = tmp_path / "m.pt"
    with apply_checkpoints(model, ["0", "1", "2..3"]):
        torch.save(model, path)
        twin = copy.deepcopy(model)
        assert "forward" in model[1].__dict__
    assert b"gradscope" not in path.read_bytes()
    assert not any("forward" in m.__dict__ and type(m.__dict__["forward"]).__name__ ==
                   "_Checkpointed" for m in twin.modules())
    assert torch.equal(twin(x), out)
    # a fresh interpreter in which gradscope cannot be imported loads it and runs it
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys; sys.modules['gradscope'] = None; import torch; "
            f"m = torch.load({str(path)!r}, weights_only=False); "
            f"x = torch.load({str(tmp_path / 'x.pt')!r}); "
            "print(type(m[1]).__name__, type(m[2]).__name__, m(x).sum().item())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:2] == ["Sequential", "Conv2d"]
    assert float(done.stdout.split()[2]) == pytest.approx(out.sum().item(), rel=1e-6)


class Aborts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)
        self.mode = "ok"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.mode == "raise":
            raise ValueError("the data loader ran dry")
        if self.mode == "break":
            return self.c(self.b(x))  # not a's output: the chain is broken
        return self.c(self.b(h))


def test_after_an_aborted_forward_a_later_segment_module_runs_alone():
    torch.manual_seed(0)
    model, x = Aborts(), torch.randn(4, 8)
    out = model(x)
    with apply_checkpoints(model, ["a..b..c"]):
        model.mode = "raise"
        with pytest.raises(ValueError, match="ran dry"):
            model(x)
        assert torch.equal(model.b(x), torch.tanh(x))  # alone, as usual
        assert torch.equal(model.c(x), nn.functional.linear(x, model.c.weight, model.c.bias))
        model.mode = "ok"
        assert torch.equal(model(x), out)
        model.mode = "break"  # inside the parent's forward a broken chain still raises
        with pytest.raises(gs.GradscopeError, match="no longer hands"):
            model(x)


def test_gpt2_with_its_cache_predicted_as_measured():
    """Issue 27: the KV cache, passed to every attention as an argument, is kept by a
    checkpoint of ``attn`` (and the cache holds views of the qkv projection)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=256,
                        bos_token_id=0, eos_token_id=0)  # use_cache stays on, as by default
    model = tf.GPT2LMHeadModel(cfg).train()
    x = torch.randint(0, 256, (2, 64))

    def loss_fn(out):
        return out.logits.float().pow(2).mean()

    rep = gs.activation_report(model, x, loss_fn=loss_fn)
    base_gap = gs.measure_forward(model, x, loss_fn=loss_fn) - rep.total
    assert abs(base_gap) < 1024  # a few bytes the graph does not hold
    for mods in (["transformer.h.0.attn"], ["transformer.h.0"]):
        with apply_checkpoints(model, mods):
            measured = gs.measure_forward(model, x, loss_fn=loss_fn)
        assert measured - rep.predict(mods) == base_gap, mods


class Counts(nn.Module):
    """A buffer reassigned out of place in the forward (``self.count = self.count + 1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        return torch.tanh(self.lin(x))


def test_a_buffer_reassigned_in_the_forward_is_counted_once():
    torch.manual_seed(0)
    model, x = nn.Sequential(Counts(), nn.Linear(8, 1)), torch.randn(4, 8)
    with apply_checkpoints(model, ["0"]):
        model(x).sum().backward()  # the recomputation runs the forward again
    assert model[0].count.item() == 1
