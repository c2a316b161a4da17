"""The model-file contract: what ``gradscope render FILE[:NAME]`` loads and runs.

A model file is imported as a module (its folder on ``sys.path``, ``__name__`` not
``"__main__"``, so an ``if __name__ == "__main__":`` block does not run). Then:

1. ``FILE:NAME``: ``NAME`` must be a zero-argument callable or an ``nn.Module``.
2. Otherwise the first of a zero-argument callable ``build``, or the pair ``model`` (an
   ``nn.Module``) and ``example_input`` (a tensor or a tuple of tensors).
3. A callable may return outputs (a tensor or a nest of tensors), a pair ``(module, inputs)``,
   or a module alone when the file also has ``example_input``.
4. ``loss_fn`` (optional) turns the output into a loss for ``--loss``.

Training (``gradscope report``, ``ModelFile.training()``) is the other half of the contract: the
file also supplies ``loss_fn(output, target)`` (or ``loss_fn(output)``), optionally ``batches()``
(an iterable of ``(inputs, target)`` pairs, or ``(inputs, target, ids)`` triples whose ``ids``
name the batch's examples (a spike names them), or of inputs when ``loss_fn`` takes only the
output; default: ``example_input`` and ``example_target`` again and again) and
``optimizer(params)`` (default SGD, lr 1e-2).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .backward.records import BackwardTrace, ForwardNonFinite
from .doctor.findings import torch_error_kind
from .errors import ModelFileError, ReportError

#: what every "nothing found" error ends with (one line: the CLI prints it as it is)
TEMPLATE = ("a model file defines model (an nn.Module) and example_input, optionally "
            "loss_fn(output), or a build() returning (model, example_input)")
#: A valid model file, five lines (what every command's ``--help`` shows; the CLI reads it
#: from this source without importing the module, which imports torch).
TEMPLATE_CODE = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
example_input = torch.randn(16, 4)  # a tensor, or a tuple of tensors
def loss_fn(output):  # optional: render --loss, report, doctor, memory
    return output.pow(2).mean()"""


_LOSS_HINT = (
    "define loss_fn(output, target) (with batches() yielding (inputs, target) pairs or an "
    "example_target), or loss_fn(output)"
)


@dataclass
class Forward:
    """What running a model file produced."""

    outputs: Any
    model: torch.nn.Module | None
    inputs: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)  # a dict of inputs, spread as keywords
    target: Any = None  # the file's example_target, when its loss_fn takes one

    @property
    def given(self) -> tuple[Any, ...]:
        """Everything the file gave the forward and its loss, as one nest: what
        ``gs.trace(inputs=...)`` and ``gs.trace_backward(inputs=...)`` take, so that every
        path's ``Graph.memory()`` counts the file's tensors (with the model's parameters and
        buffers) apart from activations, as ``gs.activation_report`` does."""
        return self.inputs, self.kwargs, self.target


@dataclass
class BackwardRun:
    """A model file's forward and backward, recorded (``ModelFile.backward()``).

    Attributes:
        trace: the ``BackwardTrace``; ``trace.graph`` is the annotated graph.
        forward_nonfinite: the first forward op whose output held a NaN or Inf, or None; when
            set, the gradients' NaN/Inf comes from it, not from backward.
    """

    trace: BackwardTrace
    forward_nonfinite: ForwardNonFinite | None


@dataclass
class Training:
    """What ``gradscope report`` trains (``ModelFile.training()``): the file's model, loss,
    batches and optimizer, each checked once before the first step."""

    file: ModelFile
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[..., Any]
    batches: Iterator[tuple[Any, Any, Any]]
    #: the ids of the examples of the batch ``next_batch`` returned last (the third item of
    #: a ``batches()`` triple), else None
    ids: Any = None
    #: how many batches ``next_batch`` has given
    taken: int = 0

    def next_batch(self) -> tuple[Any, Any] | None:
        """The next ``(inputs, target)`` pair (target None when loss_fn takes only the
        output; its ids, if ``batches()`` gave them, in ``ids``), or None when ``batches()``
        ran out."""
        item = self.file.call("taking the next batch from batches()", next, self.batches, None)
        if item is None:
            self.ids = None
            if not self.taken:
                raise ReportError(
                    f"{self.file.path}: batches() gave no batch at all; yield at least one "
                    "(inputs, target) pair (or leave batches() out: example_input is repeated)"
                )
            return None
        self.taken += 1
        inputs, target, self.ids = item
        return inputs, target

    def step(self, batch: tuple[Any, Any],
             on_loss: Callable[[torch.Tensor], None] | None = None) -> None:
        """One optimizer step on ``batch``: zero_grad, forward, loss, backward, step
        (``on_loss(loss)`` before the backward: ``GradMonitor.observe_loss``).

        Raises:
            ReportError: loss_fn did not return a scalar tensor with a graph.
            ModelFileError: the user's code raised (the message names the file and line).
        """
        mf = self.file
        inputs, target = batch
        self.optimizer.zero_grad(set_to_none=True)
        out = mf.run_model(self.model, inputs)
        fn = self.loss_fn
        loss = mf.call("running loss_fn", lambda: fn(out) if target is None else fn(out, target))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ReportError(
                f"{mf.path}: loss_fn returned {type(loss).__name__} "
                f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}; expected "
                "a scalar tensor that depends on the model's parameters"
            )
        if on_loss is not None:
            on_loss(loss)
        mf.call("running backward", loss.backward)
        mf.call("running optimizer.step()", self.optimizer.step)


def _where(exc: BaseException, path: Path) -> str:
    """``file:line`` of the deepest frame of ``exc`` inside ``path`` (else the deepest frame)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    target = str(path.resolve())
    inside = [f for f in frames if str(Path(f.filename).resolve()) == target]
    if not (inside or frames):
        return str(path)
    frame = (inside or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def _all_finite(outputs: Any) -> bool:
    """Whether every floating value of ``outputs`` is finite (False when one cannot be read:
    a float8 tensor ``isfinite`` does not take is widened first)."""
    from .graph.nest import iter_tensors
    from .graph.tensor_facts import checkable

    try:
        with torch.no_grad():
            for _, t in iter_tensors(outputs):
                if not (t.is_floating_point() or t.is_complex()):
                    continue
                c = checkable(t)
                if c is None or not bool(torch.isfinite(c).all()):
                    return False
    except Exception:  # a tensor that cannot be checked: not known to be finite
        return False
    return True


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` raises (the user's
    class may do anything): the one-line error must still be one line."""
    try:
        return str(exc)
    except Exception as inner:  # any failure of the user's code
        return f"(its message could not be read: {type(inner).__name__} in __str__)"


def _describe(exc: BaseException) -> str:
    msg = _message(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@contextlib.contextmanager
def _user_code(path: Path, doing: str) -> Iterator[None]:
    """Turn an exception raised by the user's code into a one-line ModelFileError."""
    try:
        yield
    except ModelFileError:
        raise
    except KeyboardInterrupt:
        raise  # the user pressed Ctrl-C: the CLI says "interrupted" and exits 130
    except SystemExit as exc:  # sys.exit() / exit() in the file: nothing to render, say so
        raise ModelFileError(
            f"{_where(exc, path)}: the file called sys.exit({exc.code!r}) (while {doing}); "
            "move that call under if __name__ == \"__main__\": (gradscope imports the file as a "
            "module, so that block does not run)"
        ) from None
    except BaseException as exc:  # the user's code may raise anything, even non-Exceptions
        raise ModelFileError(
            f"{_where(exc, path)}: {_describe(exc)} (raised while {doing})"
            f"{_doctor_hint(exc, path)}"
        ) from exc


def _doctor_hint(exc: BaseException, path: Path) -> str:
    """For autograd's in-place / second-backward / no-grad_fn errors: where to look next."""
    if isinstance(exc, RuntimeError) and torch_error_kind(_message(exc)) is not None:
        return f"; gradscope doctor {path} shows which lines did it"
    return ""


def _zero_arg(obj: Any) -> bool:
    if not callable(obj):
        return False
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return True
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


def _as_args(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _split_spec(spec: str) -> tuple[str, str | None]:
    m = re.match(r"^(.*\.py):([A-Za-z_][A-Za-z0-9_]*)$", spec)
    if m:
        return m.group(1), m.group(2)
    return spec, None


def positional_arity(fn: Callable[..., Any]) -> int | None:
    """Number of required positional parameters of ``fn`` (None when it cannot be told)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(
        1
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


class ModelFile:
    """A loaded model file (see the module docstring for the contract).

    Example:
        >>> mf = load_model_file("samples/mlp.py")          # doctest: +SKIP
        >>> fwd = mf.forward()                              # doctest: +SKIP
        >>> graph = gradscope.trace(fwd.outputs, model=fwd.model)   # doctest: +SKIP
    """

    def __init__(self, path: Path, module: ModuleType, name: str | None) -> None:
        self.path = path
        self.module = module
        self.name = name

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, name={self.name!r})"

    def call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the user's ``fn(*args, **kwargs)``; anything it raises becomes a one-line
        ``ModelFileError`` naming the file and line (``doing`` says what was running)."""
        with _user_code(self.path, doing):
            return fn(*args, **kwargs)

    def run_model(self, module: torch.nn.Module, inputs: Any) -> Any:
        """``module(inputs)``: a tuple/list is spread as arguments, a dict as keywords."""
        args, kwargs = _as_args(inputs)
        return self.call(f"running the forward of {type(module).__name__}", module, *args, **kwargs)

    @property
    def loss_takes_target(self) -> bool:
        """Whether the file's ``loss_fn`` takes ``(output, target)`` rather than ``(output)``."""
        fn = self.get("loss_fn")
        arity = positional_arity(fn) if callable(fn) else None
        return arity is not None and arity >= 2

    def get(self, attr: str, default: Any = None) -> Any:
        """A module-level name of the file, or ``default``."""
        return getattr(self.module, attr, default)

    def has(self, attr: str) -> bool:
        return hasattr(self.module, attr)

    # ------------------------------------------------------------------ errors
    def _nothing_found(self, found: str, expected: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path}: {found}; expected {expected}; {TEMPLATE}"
        )

    def _found_names(self) -> str:
        names = [
            n
            for n in vars(self.module)
            if not n.startswith("_") and not isinstance(getattr(self.module, n), ModuleType)
        ]
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        return f"found only: {shown}" if names else "found no top-level names"

    def example_input(self, why: str) -> Any:
        if not self.has("example_input"):
            raise self._nothing_found(
                f"{why}, but the file defines no example_input",
                "example_input = a tensor or a tuple of tensors to call the model with",
            )
        return self.get("example_input")

    # ------------------------------------------------------------------ running
    def _entry(self) -> tuple[str, Any]:
        if self.name is not None:
            if not self.has(self.name):
                raise self._nothing_found(
                    f"no name {self.name!r} in the file ({self._found_names()})",
                    f"{self.name} to be a zero-argument callable or an nn.Module",
                )
            obj = self.get(self.name)
            if not isinstance(obj, torch.nn.Module) and not _zero_arg(obj):
                kind = "a callable that needs arguments" if callable(obj) else type(obj).__name__
                raise self._nothing_found(
                    f"{self.name} is {kind}",
                    f"{self.name} to be a zero-argument callable or an nn.Module",
                )
            return self.name, obj
        build = self.get("build")
        if build is not None and _zero_arg(build):
            return "build", build
        model = self.get("model")
        if isinstance(model, torch.nn.Module):
            self.example_input("found model")
            return "model", model
        if isinstance(model, type) and issubclass(model, torch.nn.Module):
            raise self._nothing_found(
                "model is the class " + model.__name__ + ", not an instance",
                f"model = {model.__name__}(...)",
            )
        raise self._nothing_found(
            f"neither a zero-argument build() nor model + example_input ({self._found_names()})",
            "a zero-argument build(), or model (an nn.Module) with example_input",
        )

    def build(self) -> tuple[torch.nn.Module | None, Any, Any]:
        """Resolve the entry point: ``(module, inputs, None)`` or ``(None, None, outputs)``."""
        label, obj = self._entry()
        return self._resolve(label, self._call(label, obj))

    def _call(self, label: str, obj: Any) -> Any:
        """The entry point's value: a module as it is, a callable's result."""
        if isinstance(obj, torch.nn.Module):
            return obj
        with _user_code(self.path, f"running {label}()"), torch.enable_grad():
            return obj()

    def _resolve(self, label: str, obj: Any) -> tuple[torch.nn.Module | None, Any, Any]:
        if isinstance(obj, torch.nn.Module):
            return obj, self.example_input(f"{label} gave an nn.Module to run"), None
        if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
            return obj[0], obj[1], None
        return None, None, obj

    def forward(self) -> Forward:
        """Build the entry point and run the forward (under ``torch.enable_grad``), recording
        module scopes (``gs.scopes``) when the file hands gradscope a module to run."""
        module, inputs, outputs = self.build()
        return self._forward(module, inputs, outputs)

    def _forward(self, module: torch.nn.Module | None, inputs: Any, outputs: Any) -> Forward:
        if module is None:
            return Forward(outputs=outputs, model=None, inputs=())
        from .graph.scopes import scopes  # imported here: plain output files never need it

        with torch.enable_grad(), scopes(module):
            out = self.run_model(module, inputs)
        args, kwargs = _as_args(inputs)
        target = self.get("example_target") if self.loss_takes_target else None
        return Forward(outputs=out, model=module, inputs=args, kwargs=kwargs, target=target)

    def loss(self, output: Any, target: Any = None) -> Any:
        """Apply the file's ``loss_fn`` to ``output`` (and ``target`` when it takes two)."""
        fn = self.get("loss_fn")
        if fn is None or not callable(fn):
            raise self._nothing_found(
                "--loss was given but the file defines no loss_fn",
                "def loss_fn(output): ... returning a scalar tensor",
            )
        arity = positional_arity(fn)
        with _user_code(self.path, "running loss_fn"), torch.enable_grad():
            if arity is not None and arity >= 2:
                if target is None:
                    target = self.get("example_target")
                if target is None:
                    raise self._nothing_found(
                        "loss_fn takes (output, target) but the file has no example_target",
                        "example_target = a tensor, or def loss_fn(output)",
                    )
                return fn(output, target)
            return fn(output)


    def batch_loss(self) -> Callable[[Any], Any] | None:
        """The file's ``loss_fn`` as a function of the output alone, for forwards run on the
        first rows of the batch (``activation_report(batch_scale=)`` runs half of it): an
        ``example_target`` with more rows (dim 0) than the output is cut to the output's rows,
        as the inputs were. None when the file has no ``loss_fn``."""
        if not callable(self.get("loss_fn")):
            return None
        from .graph.nest import iter_tensors

        def rows(value: Any) -> int | None:
            return next((t.shape[0] for _, t in iter_tensors(value) if t.dim() > 0), None)

        def cut(value: Any, full: int, n: int) -> Any:
            if isinstance(value, torch.Tensor):
                # its own storage: a view would hold (and count) the whole target's
                return (value[:n].clone() if value.dim() > 0 and value.shape[0] == full
                        else value)
            if isinstance(value, (tuple, list)):
                return type(value)(cut(v, full, n) for v in value)
            if isinstance(value, dict):
                return {k: cut(v, full, n) for k, v in value.items()}
            return value

        def loss(output: Any) -> Any:
            target = self.get("example_target")
            full, n = rows(target), rows(output)
            if full is not None and n is not None and n < full:
                target = cut(target, full, n)
            return self.loss(output, target)

        return loss

    def target_builder(self) -> Callable[[int], Any] | None:
        """What ``max_batch`` builds each candidate's target with, when ``loss_fn`` takes
        ``(output, target)``: the file's ``build_target(batch)``, or else its
        ``example_target`` with its rows (dim 0) tiled or cut to the batch (every tensor of
        it whose first dimension is the example's batch). None when the loss takes no target.

        Raises:
            ModelFileError: the loss takes a target and the file has neither.
        """
        fn = self.get("loss_fn")
        arity = positional_arity(fn) if callable(fn) else None
        if arity is None or arity < 2:
            return None
        build = self.get("build_target")
        if callable(build):
            return lambda batch: self.call("calling build_target(batch)", build, batch)
        target = self.get("example_target")
        if target is None:
            raise self._nothing_found(
                "loss_fn takes (output, target) but the file has neither build_target(batch) "
                "nor example_target",
                "def build_target(batch): return torch.randint(0, 10, (batch,))",
            )
        from .graph.nest import iter_tensors

        rows = next((t.shape[0] for _, t in iter_tensors(target) if t.dim() > 0), None)

        def tile(value: Any, batch: int) -> Any:
            if isinstance(value, torch.Tensor):
                if rows is None or value.dim() == 0 or value.shape[0] != rows:
                    return value
                times = -(-batch // rows)
                return value.repeat(times, *([1] * (value.dim() - 1)))[:batch]
            if isinstance(value, (tuple, list)):
                return type(value)(tile(v, batch) for v in value)
            if isinstance(value, dict):
                return {k: tile(v, batch) for k, v in value.items()}
            return value

        return lambda batch: tile(target, batch)

    # ------------------------------------------------------------------ backward
    def backward(self, *, saved: bool = True) -> BackwardRun:
        """Forward (and ``loss_fn`` when the file has one) with forward lines and the first
        non-finite forward value recorded, then backward under the recorder
        (``gs.trace_backward``: ones as the gradient of non-scalar outputs; the file's inputs
        given, so the graph's memory counts them apart from activations). The autograd
        graph is released afterwards.

        The entry point (``build()``, the module's construction) runs with no recorder; only
        the forward gradscope runs is recorded. A callable that returns outputs is its own
        forward: it runs once unrecorded (to see what it gives) and once more recorded.

        Raises:
            ModelFileError: the user's code, or backward, raised.
        """
        from .backward.annotate import trace_backward
        from .backward.forward import record_forward

        label, obj = self._entry()
        # Building is no part of the forward: the entry point runs with no recorder at all, so
        # what constructors do (torch.empty, a buffer filled with NaN and then overwritten,
        # Embedding's padding row zeroed under no_grad) is never seen, let alone a finding.
        made = obj if isinstance(obj, torch.nn.Module) else self._call(label, obj)
        module, inputs, outputs = self._resolve(label, made)
        with record_forward(check_finite=True) as forward:
            if module is not None:  # only the forward gradscope runs (and the loss) is recorded
                given = "example_input" if isinstance(made, torch.nn.Module) else f"{label}()[1]"
                forward.name_inputs(_labels(module, inputs, given))
                fwd = self._forward(module, inputs, None)
            elif _has_graph(outputs):
                # the callable returned outputs: it is the forward, so it runs once more,
                # recorded; the unrecorded run's graph is dropped first (nothing walked it)
                made = outputs = None
                outputs = self._call(label, obj)
                fwd = self._forward(None, None, outputs)
            else:  # nothing to record: the walk says what is wrong with it
                fwd = self._forward(None, None, outputs)
            root = self.loss(fwd.outputs) if self.has("loss_fn") else fwd.outputs
        outputs_finite = _all_finite(root)
        try:
            trace = trace_backward(root, model=fwd.model, saved=saved, keep=fwd.outputs,
                                   inputs=fwd.given)
        except RuntimeError as exc:
            first = (_message(exc).strip().splitlines() or [""])[0]
            raise ModelFileError(f"{self.path}: backward raised RuntimeError: {first}"
                                 f"{_doctor_hint(exc, self.path)}") from exc
        found = forward.first_nonfinite
        if found is not None and outputs_finite and trace.first_nonfinite is None:
            found.masked = True  # never reached the outputs or a gradient: said, not a finding
        trace.forward_nonfinite = found
        return BackwardRun(trace, found)

    # ------------------------------------------------------------------ training
    def training(self) -> Training:
        """The model, loss, batches and optimizer ``gradscope report`` trains (see the module
        docstring), each checked before the first step.

        Raises:
            ReportError: something training needs is missing or of the wrong kind (the
                message says what to define).
            ModelFileError: the user's code raised.
        """
        model = self._training_model()
        loss_fn = self.get("loss_fn")
        if loss_fn is None or not callable(loss_fn):
            raise ReportError(
                f"{self.path}: report trains the model but the file defines no loss_fn; "
                f"{_LOSS_HINT}"
            )
        wants_target = self.loss_takes_target
        module, example = model
        batches = self._batches(example, wants_target)
        return Training(self, module, self._optimizer(module), loss_fn, batches)

    def _training_model(self) -> tuple[torch.nn.Module, Any]:
        module, inputs, _ = self.build()
        if module is None:
            raise ReportError(
                f"{self.path}: report trains a model, but the entry point returned outputs, "
                "not a module; define model and example_input, or build() returning "
                "(model, inputs)"
            )
        return module, inputs

    def _batches(self, example: Any, wants_target: bool) -> Iterator[tuple[Any, Any, Any]]:
        """``(inputs, target, ids)`` (target None when loss_fn takes only the output; ids: the
        third item of a triple, or a dict batch's ``"id"``/``"idx"``, else None)."""
        from .monitor.replay import ids_in

        source = self.get("batches")
        if source is None:
            target = self.get("example_target")
            if wants_target and target is None:
                raise ReportError(
                    f"{self.path}: loss_fn takes (output, target) but the file has neither "
                    f"batches() nor example_target; {_LOSS_HINT}"
                )
            return itertools.repeat((example, target, None))
        items = self.call("calling batches()", source) if callable(source) else source
        it = iter(items)
        if not wants_target:
            return ((x, None, ids_in(x)) for x in it)
        return (self._pair(item, ids_in) for item in it)

    def _pair(self, item: Any, ids_in: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
        if isinstance(item, (tuple, list)) and len(item) in (2, 3):
            ids = item[2] if len(item) == 3 else None
            if ids is not None and (isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__")):
                raise ReportError(
                    f"{self.path}: batches() gave {type(ids).__name__} {_short(ids)} as the "
                    "third item, the batch's example ids; give one id per example (a list or "
                    "a tensor), or yield (inputs, target) pairs"
                )
            return item[0], item[1], ids_in(item[0]) if ids is None else ids
        raise ReportError(
            f"{self.path}: batches() gave a {type(item).__name__}, but loss_fn takes "
            "(output, target), so each batch must be an (inputs, target) pair or an "
            "(inputs, target, ids) triple"
        )

    def _optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        make = self.get("optimizer")
        if make is None:
            return torch.optim.SGD(model.parameters(), lr=1e-2)
        opt = self.call("calling optimizer(params)", lambda: make(model.parameters()))
        if not isinstance(opt, torch.optim.Optimizer):
            raise ReportError(
                f"{self.path}: optimizer(params) returned a {type(opt).__name__}; expected "
                "a torch.optim.Optimizer, e.g. return torch.optim.SGD(params, lr=1e-2)"
            )
        return opt


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (a value from a file is data, not text
    to print whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _has_graph(outputs: Any) -> bool:
    """Whether any tensor of ``outputs`` requires grad (has a graph backward can run)."""
    from .graph.nest import iter_tensors

    return any(t.requires_grad for _, t in iter_tensors(outputs))


def _labels(module: torch.nn.Module, inputs: Any, given: str) -> Iterator[tuple[str, Any]]:
    """What a NaN already in a tensor the forward is given is called: ``the input
    example_input[0]``, ``the parameter fc.weight``, ``the buffer bn.running_mean``."""
    from .graph.nest import iter_tensors

    for path, t in iter_tensors(inputs, given):
        yield f"the input {path}", t
    for name, p in module.named_parameters():
        yield f"the parameter {name}", p
    for name, b in module.named_buffers():
        yield f"the buffer {name}", b


def model_file_path(spec: str | Path) -> Path:
    """The file of ``path/to/model.py[:NAME]``, without reading or running it (the CLI names
    its default output after it before anything runs).

    Example:
        >>> model_file_path("samples/functions.py:ClippedReLU").name
        'functions.py'
    """
    return Path(_split_spec(str(spec))[0])


def load_model_file(spec: str | Path) -> ModelFile:
    """Import a model file ``path/to/model.py[:NAME]`` without running its ``__main__`` block.

    Raises:
        ModelFileError: the file is missing, is not Python, or raised while importing (the
            message names the file and line).
    """
    path_str, name = _split_spec(str(spec))
    path = Path(path_str)
    if not path.exists():
        raise ModelFileError(
            f"no such file: {path} (give the path of a Python model file, e.g. samples/mlp.py)"
        )
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory; give the path of a Python model file")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = "gradscope_model_" + re.sub(r"\W", "_", path.stem)
    spec_obj = importlib.util.spec_from_file_location(mod_name, path)
    if spec_obj is None or spec_obj.loader is None:
        raise ModelFileError(f"cannot import {path}: not a Python file (expected a .py model file)")
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[mod_name] = module
    try:
        with _user_code(path, "importing the model file"):
            spec_obj.loader.exec_module(module)
    except ModelFileError:
        sys.modules.pop(mod_name, None)
        raise
    return ModelFile(path, module, name)
