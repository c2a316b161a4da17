"""``gs.check``: gradcheck and gradgradcheck with a result that says what is wrong.

PyTorch's own ``torch.autograd.gradcheck`` / ``gradgradcheck`` decide pass or fail (they are the
ground truth). gradscope then computes the same Jacobians itself -- central finite differences
for the numerical one, one backward per output element for the analytical one -- to name the
input, the output and the worst element, and to draw both Jacobians side by side.

Jacobians follow gradcheck's layout: rows are elements of an input, columns elements of an
output, so ``CheckFailure.index == (input_element, output_element)``, flat (row-major) indices.
For order 2 the function checked is the one gradgradcheck builds, ``(inputs, grad_outputs) ->
gradients of the inputs``: ``input_index`` counts the inputs and then the grad_outputs, and
``output_index`` names the input whose gradient it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from ..errors import CheckInputError
from .check_records import ORDER_NAME, CheckResult, JacobianBlock

#: Jacobians are computed (and kept) only up to this many elements per input / output, and
#: big ones are summarised by their worst element.
_MAX_NUMEL = 4096
#: Jacobians of a check that passed are computed only when this small (to show them).
_SMALL_PASS = 64

_ORDER_NAME = ORDER_NAME


# ---------------------------------------------------------------------------------- inputs
def _callable(fn: Any) -> tuple[Callable[..., Any], str]:
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        return fn.apply, fn.__name__
    if isinstance(fn, type) or not callable(fn):
        raise CheckInputError(
            f"cannot check a {type(fn).__name__ if not isinstance(fn, type) else fn.__name__}: "
            "expected a torch.autograd.Function subclass or a function of tensors"
        )
    owner = getattr(fn, "__self__", None)  # SomeFunction.apply: name the Function
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        return fn, owner.__name__
    return fn, getattr(fn, "__name__", type(fn).__name__)


def _prepare(inputs: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """Copy tensor inputs (float32/16 become float64) so the caller's tensors stay untouched."""
    if not inputs:
        raise CheckInputError(
            "no inputs given: call gs.check(fn, x, ...) with the tensors to call fn with "
            "(float64, requires_grad=True)"
        )
    notes: list[str] = []
    out: list[Any] = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            out.append(x)  # non-tensor arguments (clip_val, dim) pass through unchanged
            continue
        y = x.detach()
        if y.is_floating_point() and y.dtype != torch.float64:
            notes.append(
                f"input {i} is {str(y.dtype).removeprefix('torch.')}; checked a float64 copy "
                "(finite differences need double precision)"
            )
            y = y.to(torch.float64)
        out.append(y.clone().requires_grad_(x.requires_grad))
    tensors = [t for t in out if isinstance(t, torch.Tensor)]
    if not any(t.requires_grad for t in tensors):
        floats = [
            i for i, t in enumerate(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        if not floats:
            raise CheckInputError(
                "no floating-point tensor among the inputs, so there is nothing to differentiate; "
                "pass at least one float64 tensor with requires_grad=True"
            )
        for i in floats:
            out[i].requires_grad_(True)
        notes.append(f"no input required grad; checked inputs {floats} with requires_grad=True")
    return out, notes


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _differentiable(outs: tuple[Any, ...]) -> list[int]:
    return [k for k, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]


def _first_run(call: Callable[..., Any], args: list[Any], name: str) -> list[int]:
    try:
        outs = _as_tuple(call(*args))
    except Exception as exc:  # the user's forward may raise anything
        raise CheckInputError(
            f"calling {name} with the given inputs raised {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}; "
            "check the number, shapes and dtypes of the inputs"
        ) from exc
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        raise CheckInputError(
            f"{name} returned {', '.join(bad)}; expected a tensor or a tuple of tensors"
        )
    diff = _differentiable(outs)
    if not diff:
        raise CheckInputError(
            f"no output of {name} requires grad, so there is no backward to check; "
            "make sure the inputs it differentiates have requires_grad=True"
        )
    return diff


# ---------------------------------------------------------------------------------- Jacobians
def _flat(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return (torch.zeros_like(like) if t is None else t).detach().reshape(-1)


def _analytical(
    func: Callable[..., tuple[Any, ...]], args: list[Any], diff_in: list[int], outs_k: list[int]
) -> dict[tuple[int, int], torch.Tensor]:
    """(input, output) -> Jacobian (rows input elements) from one backward per output element."""
    with torch.enable_grad():
        outs = func(*args)
    jac: dict[tuple[int, int], torch.Tensor] = {}
    for k in outs_k:
        out = outs[k]
        rows: dict[int, list[torch.Tensor]] = {i: [] for i in diff_in}
        for e in range(out.numel()):
            grads: Sequence[torch.Tensor | None]
            if out.requires_grad:
                onehot = torch.zeros_like(out).reshape(-1)
                onehot[e] = 1
                grads = torch.autograd.grad(
                    out, [args[i] for i in diff_in], onehot.view_as(out), retain_graph=True,
                    allow_unused=True,
                )
            else:  # an output that does not depend on any input
                grads = (None,) * len(diff_in)
            for i, g in zip(diff_in, grads, strict=True):
                rows[i].append(_flat(g, args[i]))
        for i in diff_in:
            cols = rows[i]
            jac[i, k] = torch.stack(cols, 1) if cols else torch.zeros(args[i].numel(), 0)
    return jac


def _numerical(
    func: Callable[..., tuple[Any, ...]],
    args: list[Any],
    diff_in: list[int],
    outs_k: list[int],
    eps: float,
) -> dict[tuple[int, int], torch.Tensor]:
    """(input, output) -> Jacobian by central differences, as gradcheck computes it."""
    jac: dict[tuple[int, int], list[torch.Tensor]] = {(i, k): [] for i in diff_in for k in outs_k}
    for i in diff_in:
        base = args[i].detach()
        for e in range(base.numel()):
            values = []
            for step in (eps, -eps):
                moved = base.clone()
                moved.view(-1)[e] += step
                trial = [moved.requires_grad_(True) if j == i else _fresh(a)
                         for j, a in enumerate(args)]
                outs = func(*trial)
                values.append([outs[k].detach().reshape(-1) for k in outs_k])
            for k, plus, minus in zip(outs_k, values[0], values[1], strict=True):
                jac[i, k].append((plus - minus) / (2 * eps))
    return {key: torch.stack(rows, 0) for key, rows in jac.items()}


def _fresh(a: Any) -> Any:
    """A new leaf on the same data, so each evaluation builds its own graph."""
    return a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a


def _blocks(
    order: int,
    func: Callable[..., tuple[Any, ...]],
    args: list[Any],
    diff_in: list[int],
    outs_k: list[int],
    out_index: Callable[[int], int],
    tol: tuple[float, float, float],
) -> list[JacobianBlock]:
    eps, atol, rtol = tol
    outs = func(*args)
    num = _numerical(func, args, diff_in, outs_k, eps)
    ana = _analytical(func, args, diff_in, outs_k)
    blocks = []
    for i in diff_in:
        for k in outs_k:
            n, a = num[i, k], ana[i, k]
            bad = (a - n).abs() > atol + rtol * n.abs()
            bad |= torch.isnan(a) != torch.isnan(n)
            blocks.append(
                JacobianBlock(
                    order, i, out_index(k), tuple(args[i].shape), tuple(outs[k].shape),
                    n.tolist(), a.tolist(), [tuple(rc) for rc in bad.nonzero().tolist()],
                )
            )
    return blocks


def _numel_ok(tensors: list[Any]) -> bool:
    return all(t.numel() <= _MAX_NUMEL for t in tensors if isinstance(t, torch.Tensor))


# ---------------------------------------------------------------------------------- the check
def _run_torch(check_fn: Callable[..., bool], *args: Any, **kwargs: Any) -> tuple[bool, str | None]:
    """Run torch's check; GradcheckError carries its explanation, which we keep."""
    try:
        return bool(check_fn(*args, raise_exception=True, **kwargs)), None
    except GradcheckError as exc:
        return False, str(exc).strip()
    except Exception as exc:  # the user's backward may raise anything
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return False, f"{type(exc).__name__} raised during the check: {first}"


def check(
    fn: Any,
    *inputs: Any,
    double: bool = True,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
) -> CheckResult:
    """gradcheck (and gradgradcheck) ``fn`` on ``inputs`` and explain any mismatch.

    Args:
        fn: a ``torch.autograd.Function`` subclass (its ``.apply`` is called) or a function of
            tensors returning a tensor or a tuple of tensors.
        *inputs: the arguments; tensors are copied (float32/float16 become float64, with a
            note), non-tensor arguments (``clip_val``, ``dim``) pass through unchanged. ``fn``
            runs on clones, so a Function that works in place (``ctx.mark_dirty``) can be checked.
        double: also run gradgradcheck (second derivatives through the backward).
        eps: finite-difference step.
        atol: absolute tolerance, as in gradcheck.
        rtol: relative tolerance, as in gradcheck.

    Returns:
        A ``CheckResult``: ``.ok``, ``.failures`` (worst element per failing input/output pair),
        ``.notes``; print it with rich to see the Jacobians side by side.

    Raises:
        CheckInputError: ``fn`` is not callable, no input can be differentiated, or the forward
            raises on the inputs.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        >>> gs.check(torch.sin, x).ok
        True
    """
    call, name = _callable(fn)
    args, notes = _prepare(inputs)
    diff_in = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]

    def run(*xs: Any) -> tuple[Any, ...]:
        # clones: fn may modify its inputs in place, which must not touch gradcheck's tensors
        return _as_tuple(call(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs]))

    outs_k = _first_run(run, args, name)
    tol = (eps, atol, rtol)
    result = CheckResult(name, True, notes=notes, orders=(1, 2) if double else (1,))
    if any(isinstance(a, torch.Tensor) and a.is_complex() for a in args):
        notes.append("complex inputs: pass/fail is gradcheck's, the Jacobians are not shown")
        tol = (-eps, atol, rtol)  # a negative step marks: no Jacobians of our own

    ok1, msg1 = _run_torch(
        torch.autograd.gradcheck, run, tuple(args), eps=eps, atol=atol, rtol=rtol
    )
    _record(result, 1, ok1, msg1)
    if _want_jacobians(ok1, args, tol) and not _raised(msg1):
        try:
            blocks = _blocks(1, run, args, diff_in, outs_k, lambda k: k, tol)
        except RuntimeError as exc:
            result.notes.append(f"first-order Jacobians could not be computed: {exc}")
        else:
            _attach(result, 1, ok1, blocks)
    if double:
        _second_order(result, run, args, diff_in, outs_k, tol)
    result.ok = all(result.passed.values())
    return result


def _raised(message: str | None) -> bool:
    return message is not None and "raised during the check" in message


def _want_jacobians(ok: bool, args: list[Any], tol: tuple[float, float, float]) -> bool:
    if tol[0] <= 0 or not _numel_ok(args):
        return False
    total = sum(a.numel() for a in args if isinstance(a, torch.Tensor) and a.requires_grad)
    return not ok or total <= _SMALL_PASS


def _record(result: CheckResult, order: int, ok: bool, message: str | None) -> None:
    result.passed[order] = ok
    if message is not None:
        result.messages[order] = message
        if "raised during the check" in message:
            hint = ""
            if order == 2:
                hint = (" (backward is not differentiable, e.g. @once_differentiable or non-torch "
                        "ops; pass double=False / --no-double if only first derivatives matter)")
            result.notes.append(f"{_ORDER_NAME[order]}: {message}{hint}")


def _attach(result: CheckResult, order: int, ok: bool, blocks: list[JacobianBlock]) -> None:
    result.jacobians.extend(blocks)
    if ok:
        return  # torch's verdict is the ground truth: no failures on a pass
    found = [w for b in blocks if (w := b.worst()) is not None]
    found.sort(key=lambda f: -f.diff)
    result.failures.extend(found)
    if not found and order in result.messages and "raised" not in result.messages[order]:
        first = result.messages[order].splitlines()[0]
        result.notes.append(
            f"{_ORDER_NAME[order]} failed although every Jacobian entry agrees: {first}"
        )


def _second_order(
    result: CheckResult,
    run: Callable[..., tuple[Any, ...]],
    args: list[Any],
    diff_in: list[int],
    outs_k: list[int],
    tol: tuple[float, float, float],
) -> None:
    eps, atol, rtol = tol
    with torch.enable_grad():
        outs = run(*args)
    gen = torch.Generator().manual_seed(0)
    # fixed random grad_outputs, shared with gradgradcheck so both check the same function
    vs = [
        (torch.rand(outs[k].shape, generator=gen, dtype=torch.float64) * 2 - 1)
        .to(device=outs[k].device, dtype=outs[k].dtype).requires_grad_(True)
        for k in outs_k
    ]
    n = len(args)

    def grads(*xs: Any) -> tuple[Any, ...]:
        ins, gos = list(xs[:n]), list(xs[n:])
        with torch.enable_grad():
            o = run(*ins)
            gs_ = torch.autograd.grad(
                [o[k] for k in outs_k], [ins[i] for i in diff_in], gos, create_graph=True,
                allow_unused=True,
            )
        return tuple(torch.zeros_like(ins[i]) if g is None else g
                     for i, g in zip(diff_in, gs_, strict=True))

    ok2, msg2 = _run_torch(
        torch.autograd.gradgradcheck, run, tuple(args), tuple(vs),
        eps=abs(eps), atol=atol, rtol=rtol,
    )
    _record(result, 2, ok2, msg2)
    if ok2 or _raised(msg2):
        return
    all_args = args + vs
    if not _want_jacobians(False, all_args, tol):
        return
    in2 = diff_in + [n + j for j in range(len(vs))]
    try:
        blocks = _blocks(2, grads, all_args, in2, list(range(len(diff_in))),
                         lambda k: diff_in[k], tol)
    except RuntimeError as exc:
        result.notes.append(f"second-order Jacobians could not be computed: {exc}")
        return
    _attach(result, 2, ok2, blocks)
    failing = [b for b in blocks if b.mismatches and b.input_index < n]
    if failing and all(v == 0 for b in failing for row in b.analytical for v in row):
        result.notes.append(
            "the analytical second derivatives are all zero: backward is probably not "
            "differentiable (@once_differentiable, .detach(), or non-torch ops in backward); "
            "make it so, or pass double=False (--no-double) if only first derivatives matter"
        )
