"""Which examples of a spiking micro-batch carry its gradient: per-sample gradient norms.

At ``optimizer.step()``'s pre-hook of a step whose figures spike (the parameters still those
of the step), ``per_sample`` runs the micro-batch once more from what the ``Replayer`` kept:
its arguments, its RNG states (restored after: the run's stream goes on as without it), and
the gradient that reached each model output in the step; through ``replay_isolated``, in a
forked child where that is safe (the replay's contract: training goes on exactly as it was).
Example ``i``'s own contribution to the batch gradient is the gradient of
``sum(output_i * grad_output_i)`` (the output gradient already carries the loss's reduction:
a mean divides by B), so the per-sample norms are
exactly those of the batch gradient's parts, whatever the loss, with no ``loss_fn=`` needed.

``torch.func``: ``vmap(grad(...))`` over ``functional_call`` in chunks sized so a chunk's
gradients stay under ``CHUNK_BYTES`` (never B copies of the gradients); where ``vmap`` cannot
run the model (an op without a batching rule, a data-dependent branch) one backward per
example (``torch.autograd.grad``, one example's gradients alive at a time). The squared norms
per (example, parameter) are moved to the host in one transfer.

Coupled examples (BatchNorm in train mode: each example's output depends on the others) are
not split: the result says so in one line instead of guessing. Active dropout re-draws each
example's mask (said in the note).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .._torch import dynamo
from ..graph.nest import iter_tensors
from .incident import SampleModule, SampleNorm, module_of
from .replay import (
    MicroBatch,
    ReplayResult,
    _preserved,
    _restored_rng,
)

#: a vmap chunk's per-sample gradients stay under this many bytes
CHUNK_BYTES = 256 * 2**20
#: examples listed in ``Incident.samples``; modules in ``Incident.sample_modules``
TOP = 5


class SampleResult(ReplayResult):
    """What ``per_sample`` found (a replay's result, so ``replay_isolated`` runs it in a
    forked child like the NaN replay): the top examples, the top example's modules, a note,
    how (``vmap`` or ``loop``), the seconds it took, and the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[SampleNorm] = []
        self.modules: list[SampleModule] = []
        self.note: str | None = None
        self.method: str | None = None
        self.seconds = 0.0
        self.batch = 0
        self.norms: list[float] = []  # every example's norm (index order)


def coupling(model: torch.nn.Module) -> str | None:
    """One line when the examples of a batch are coupled in ``model``'s forward, else None."""
    for name, m in dynamo.named_modules(model):
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training:
            return (
                f"the examples of the batch are coupled (BatchNorm {name or '(model)'} in train "
                "mode: each example's gradient depends on the others), so no per-sample norms"
            )
    return None


def _dropout(model: torch.nn.Module) -> bool:
    return any(
        isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0
        for m in model.modules()
    )


def per_sample(
    model: torch.nn.Module, params: Sequence[torch.Tensor], mb: MicroBatch,
    cuda_devices: list[int], ids: Sequence[Any] | None = None,
) -> SampleResult:
    """Per-sample gradient norms of micro-batch ``mb`` on ``params`` (the watched ones);
    never raises (a failure is the result's note)."""
    res = SampleResult()
    start = time.perf_counter()
    try:
        _run(model, params, mb, cuda_devices, ids, res)
    except Exception as exc:  # noqa: BLE001 - a failed replay must not stop training
        res.note = (f"the per-sample replay failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
    res.seconds = time.perf_counter() - start
    return res


def _run(
    model: torch.nn.Module, params: Sequence[torch.Tensor], mb: MicroBatch,
    cuda_devices: list[int], ids: Sequence[Any] | None, res: SampleResult,
) -> None:
    why = coupling(model)
    if why is not None:
        res.note = why
        return
    if mb.run is not None and callable(getattr(mb.run, "example", None)):
        _framework_run(model, params, mb, cuda_devices, ids, res)
        return
    if mb.run is not None or not mb.grads:
        res.note = ("no per-sample norms: the gradient at the model's outputs was not seen "
                    "(a framework's own step, or outputs without gradient)")
        return
    batch = {g.shape[0] for g in mb.grads.values() if g.dim() > 0}
    if len(batch) != 1:
        res.note = "no per-sample norms: the model's outputs have no common batch dimension"
        return
    (b,) = batch
    res.batch = b
    if len(mb.grads) != sum(g.dim() > 0 for g in mb.grads.values()):
        # a 0-d output (the loss a model returns beside its logits) cannot be split by
        # example: the examples' parts come through the batched outputs it is computed from
        mb = copy.copy(mb)
        mb.grads = {p: g for p, g in mb.grads.items() if g.dim() > 0}
    watched = {id(p) for p in params}
    names = [n for n, p in model.named_parameters() if id(p) in watched]
    with _restored_rng(mb), _preserved(model, cuda_devices):
        try:
            sq = _vmap(model, names, mb, b)
            res.method = "vmap"
        except Exception:  # noqa: BLE001 - vmap cannot run every model: one backward each
            sq = _loop(model, names, mb, b)
            res.method = "loop"
    rows = sq.tolist()  # [B, n params]: the replay's one transfer
    _fill(res, names, rows, ids)
    res.replayed = bool(res.samples)
    if _dropout(model):
        res.note = ("dropout is active: each example's forward drew its own mask, so its "
                    "norm is that of a re-drawn mask")


def _framework_run(
    model: torch.nn.Module, params: Sequence[torch.Tensor], mb: MicroBatch,
    cuda_devices: list[int], ids: Sequence[Any] | None, res: SampleResult,
) -> None:
    """A framework's own step (Lightning's ``training_step``, loss included) that can also
    run one example of its batch (``run.example(i)``, ``run.examples()``, ``run.scale``):
    each example's loss alone, one backward each. The batch loss is fitted as ``c`` x the sum
    of the examples' losses (``c`` = 1/B for a mean) from the full step's gradient; when it is
    not such a sum (coupled examples) the note says so instead of guessing."""
    run: Any = mb.run
    b = run.examples()
    if not b:
        res.note = "no per-sample norms: the batch has no tensor with a batch dimension"
        return
    res.batch = b
    watched = {id(p) for p in params}
    names = [n for n, p in model.named_parameters() if id(p) in watched]
    named = dict(model.named_parameters())
    ps = [named[n] for n in names]
    with _restored_rng(mb), _preserved(model, cuda_devices):
        with torch.enable_grad():
            full = torch.autograd.grad(_run_loss(run()), ps, allow_unused=True)
        acc = [torch.zeros_like(p, dtype=torch.float64) for p in ps]  # one gradient's size
        rows = []
        for i in range(b):
            with torch.enable_grad():
                gs = torch.autograd.grad(_run_loss(run.example(i)), ps, allow_unused=True)
            row = []
            for a, g in zip(acc, gs, strict=True):
                if g is None:
                    row.append(torch.zeros((), dtype=torch.float64, device=a.device))
                    continue
                g64 = g.detach().to(torch.float64)
                a.add_(g64)
                row.append(g64.square().sum())
            rows.append(torch.stack(row))
    dot = sum(((f.detach().to(torch.float64) * a).sum() for f, a in zip(full, acc, strict=True)
               if f is not None), torch.zeros((), dtype=torch.float64))
    aa = sum((a.square().sum() for a in acc), torch.zeros((), dtype=torch.float64))
    ff = sum((f.detach().to(torch.float64).square().sum() for f in full if f is not None),
             torch.zeros((), dtype=torch.float64))
    c = dot / aa.clamp_min(1e-300)
    resid = (ff - 2 * c * dot + c * c * aa).clamp_min(0)
    sq = torch.stack(rows) * (c * float(getattr(run, "scale", 1.0))) ** 2
    moved = torch.cat([sq.flatten(), torch.stack([resid, ff]).to(sq)]).tolist()  # one transfer
    resid_v, ff_v = moved[-2:]
    if ff_v > 0 and math.sqrt(resid_v / ff_v) > 1e-3:
        res.note = ("no per-sample norms: the batch's loss is not a sum or mean of its "
                    "examples' own losses (the examples are coupled, e.g. an in-batch "
                    "contrastive loss)")
        return
    k = len(names)
    _fill(res, names, [moved[i * k:(i + 1) * k] for i in range(b)], ids)
    res.method = "loop"
    res.replayed = bool(res.samples)
    if _dropout(model):
        res.note = ("dropout is active: each example's forward drew its own mask, so its "
                    "norm is that of a re-drawn mask")


def _run_loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else out
    if not isinstance(loss, torch.Tensor):
        raise RuntimeError("the framework's step returned no loss tensor")
    return loss


def _split(mb: MicroBatch, b: int) -> tuple[list[Any], Any, list[bool]]:
    leaves, spec = pytree.tree_flatten((mb.args, mb.kwargs))
    batched = [isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == b
               for t in leaves]
    return leaves, spec, batched


def _contribution(out: Any, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    total: torch.Tensor | None = None
    for path, t in iter_tensors(out):
        g = grads.get(path)
        if g is not None and t.shape == g.shape and (t.is_floating_point() or t.is_complex()):
            part = (t * g.to(t.dtype)).sum()
            total = part if total is None else total + part
    if total is None:
        raise RuntimeError("no output of the replay matches the step's output gradients")
    return total


def _vmap(model: torch.nn.Module, names: list[str], mb: MicroBatch, b: int) -> torch.Tensor:
    from torch.func import functional_call, grad, vmap

    leaves, spec, batched = _split(mb, b)
    named = dict(model.named_parameters())
    fixed = {n: t.detach() for n, t in model.named_buffers()}
    fixed.update({n: p.detach() for n, p in named.items() if n not in names})
    diff = {n: named[n].detach() for n in names}
    paths = list(mb.grads)
    numel = sum(p.numel() * p.element_size() for p in diff.values())
    chunk = max(1, min(b, CHUNK_BYTES // max(1, numel)))

    def one(w: dict[str, torch.Tensor], xs: list[Any], gs: list[torch.Tensor]) -> torch.Tensor:
        full = [x.unsqueeze(0) if on else x for x, on in zip(xs, batched, strict=True)]
        args, kwargs = pytree.tree_unflatten(full, spec)
        out = functional_call(model, {**fixed, **w}, tuple(args), kwargs)
        return _contribution(out, {p: g.unsqueeze(0) for p, g in zip(paths, gs, strict=True)})

    in_leaves = [0 if on else None for on in batched]
    per = vmap(grad(one), in_dims=(None, in_leaves, [0] * len(paths)), randomness="different")
    out = []
    for lo in range(0, b, chunk):
        hi = min(b, lo + chunk)
        xs = [x[lo:hi] if on else x for x, on in zip(leaves, batched, strict=True)]
        gs = [mb.grads[p][lo:hi] for p in paths]
        with torch.enable_grad():
            g = per(diff, xs, gs)
        out.append(torch.stack(
            [g[n].detach().reshape(hi - lo, -1).to(torch.float64).square().sum(1) for n in names],
            dim=1,
        ))
    return torch.cat(out)


def _loop(model: torch.nn.Module, names: list[str], mb: MicroBatch, b: int) -> torch.Tensor:
    leaves, spec, batched = _split(mb, b)
    named = dict(model.named_parameters())
    params = [named[n] for n in names]
    rows = []
    for i in range(b):
        xs = [x[i : i + 1] if on else x for x, on in zip(leaves, batched, strict=True)]
        args, kwargs = pytree.tree_unflatten(xs, spec)
        with torch.enable_grad():
            out = model(*args, **kwargs)
            grads = {p: g[i : i + 1] for p, g in mb.grads.items()}
            gs = torch.autograd.grad(_contribution(out, grads), params, allow_unused=True)
        rows.append(torch.stack([
            torch.zeros((), dtype=torch.float64, device=params[0].device) if g is None
            else g.detach().to(torch.float64).square().sum()
            for g in gs
        ]))
    return torch.stack(rows)


def _fill(
    res: SampleResult, names: list[str], rows: list[list[float]], ids: Sequence[Any] | None,
) -> None:
    per = [sum(r) for r in rows]
    total = sum(per)
    res.norms = [math.sqrt(v) for v in per]
    order = sorted(range(len(per)), key=lambda i: -per[i])
    known = ids is not None and len(ids) == len(per)
    res.samples = [
        SampleNorm(i, math.sqrt(per[i]), per[i] / total if total > 0 else 0.0,
                   _id_text(ids[i]) if known and ids is not None else None)
        for i in order[:TOP]
    ]
    if not order or per[order[0]] <= 0:
        return
    top = rows[order[0]]
    by_module: dict[str, float] = {}
    for n, v in zip(names, top, strict=True):
        key = module_of(n)
        by_module[key] = by_module.get(key, 0.0) + v
    mods = sorted(by_module.items(), key=lambda kv: -kv[1])
    res.modules = [SampleModule(m, math.sqrt(v), v / per[order[0]]) for m, v in mods[:TOP]]


def _id_text(v: Any) -> str:
    """An example's id as text (a dataloader's ids are often a tensor's elements)."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    return str(v)


def replay_samples(replayer: Any) -> SampleResult:
    """The per-sample norms of the step's spiking micro-batch (the one whose backward grew
    the gradient norms most; a ``Replayer``'s kept micro-batches, read only), named by its
    examples' ids when it was given them, or a note saying why there are none."""
    why = replayer.why_not_alone() or replayer.why_not()  # per-sample runs on this rank alone
    if replayer.together():
        why = ("not replayed: per-sample gradients of sharded (DTensor) parameters are not "
               "computed (the forward gathers them from the other ranks)")
    if why is not None:
        res = SampleResult()
        res.note = why.replace("not replayed", "no per-sample norms", 1)
        return res
    batches, flags = replayer.batches, replayer.flags
    index = 0
    if len(batches) > 1 and len(flags) == len(batches):
        sums = torch.stack([f.to(torch.float64) for f in flags]).tolist()
        steps = [sums[0]] + [b - a for a, b in zip(sums, sums[1:], strict=False)]
        index = max(range(len(steps)), key=lambda i: steps[i])
    res = per_sample(replayer.model, replayer.params, batches[index], replayer.cuda_devices,
                     batches[index].ids)
    res.micro_batch = index
    return res
