"""``gs.doctor(model=None, optimizer=None)``: explain autograd's errors and silent failures.

A context manager around one training step (or several)::

    with gs.doctor(model, optimizer=opt) as doc:
        loss = loss_fn(model(x), y)
        loss.backward()      # an autograd error comes out as gs.AutogradError, explained
        opt.step()
    for f in doc.findings: print(f)

While the block runs, ``doctor_record._DoctorMode`` records every torch call (lineage bitsets,
in-place writes, the calls that made autograd nodes, by the nodes' sequence numbers: what they
saved is read from the graph when a finding needs it); global module hooks (``_ModuleCalls``)
keep the module of each call and which modules ran (in which mode), by id: a module's path is
named only when a finding needs it; the optimizer's step hooks check the training loop.
Backward calls (``Tensor.backward``, ``torch.autograd.grad``) are run by the doctor: a torch
error it can explain is re-raised as ``AutogradError`` (torch's message first;
an in-place op torch refuses in the forward too, at the op's call),
and after a good ``backward()`` each parameter left without a gradient gets a ``grad_none``
finding (``doctor_explain``). Nothing the doctor does changes a value or a gradient; every hook
and the mode are removed when the block ends, also when it raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._pytree import tree_map

from .._torch import dynamo, torchcompat
from .._torch.dynamo import ModuleHooks
from .._torch.handles import HookHandle
from .._torch.stamps import (
    outside_gradscope,
    torch_internal,
    user_frame,
    walk_nodes,
)
from ..errors import AutogradError, GradscopeError
from ..graph.graph import Graph
from ..graph.walk import trace_with_ids
from ..monitor.replay import autocast_now
from . import explain
from .findings import (
    DoctorReport,
    Finding,
    Site,
    findings_json,
    forward_error_reason,
    torch_error_kind,
)
from .recorder import (
    _UNSET,
    BackwardLines,
    _DoctorMode,
    _outputs,
    bit_text,
    mask_of,
    user_line,
)

_line = user_line
compiling = dynamo.compiling
unwrap = dynamo.unwrap
#: the class name of ``torch.compile``'s module wrapper (``dynamo.unwrap``)
_WRAPPER = "OptimizedModule"
_DYNAMO = "torch._dynamo"
#: ``Doctor.ran``'s entry of a module that ran in training mode
_TRAINING = (True, None)
#: ``node.metadata`` key: the numbers of the eval-mode module runs whose output is this node
_EVAL_KEY = "gradscope.doctor.eval"


def _here() -> str | None:
    """The user's line that (through torch) called the hook running now."""
    return _line(outside_gradscope(sys._getframe(1)))


class Doctor:
    """An open-able ``gs.doctor`` block (see ``doctor``).

    Attributes:
        findings: what the block found so far (``Finding`` records), in the order found.
        backwards: backward calls the block ran; ``steps``: optimizer steps it saw.
    """

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise GradscopeError(f"doctor(model=...) takes an nn.Module, got "
                                 f"{type(model).__name__}; pass the model, or nothing")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise GradscopeError(f"doctor(optimizer=...) takes a torch.optim.Optimizer, got "
                                 f"{type(optimizer).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.findings: list[Finding] = []
        self.backwards = 0
        self.steps = 0
        # one walk of the model, without names (``module_path`` names a module when a finding
        # needs it): its parameters, its modules and compiled modules
        modules = explain.modules_of(model) if model is not None else []
        if modules is None:  # a module with its own ``named_modules``
            modules = [m for _, m in model.named_modules()]  # type: ignore[union-attr]
        #: the watched parameters by bit (``names``, ``params``, ``bits``: its lists)
        self.watched = explain.Watched.of(model, modules)
        self.params = self.watched.params
        self.bits = self.watched.bits
        #: the ids of the model's modules (a compile wrapper not among them: its module is)
        self.in_model: set[int] = set()
        self.compiled: list[torch.nn.Module] = []  # the compile wrappers in the model
        in_model = self.in_model
        for m in modules:
            if type(m).__name__ == _WRAPPER and unwrap(m) is not None:
                self.compiled.append(m)
            else:
                in_model.add(id(m))
        #: id(module) -> its path, as ``dynamo.module_names``: walked when first asked for
        self._paths: dict[int, str] | None = None
        #: the module calls running: the id of each one's module of the model (None: not one)
        self.stack: list[int | None] = []
        #: per module run since the last step, by id: (its training flag, the line that
        #: called it)
        self.ran: dict[int, tuple[bool, str | None]] = {}
        #: every module that ran in the block before its latest step, by id (``ran`` starts
        #: again at each step; ``called_all``: with those since): a parameter of one of them
        #: that got no gradient is not in "a module never called"
        self.called: set[int] = set()
        #: of those that ran in eval mode: the ones whose output carried a gradient (a trained
        #: parameter before them, or their own) into a backward() since the last step: a
        #: frozen probe's backbone or teacher does not, nor a validation forward in eval()
        #: without no_grad before the training forward (its graph is not backwarded)
        self.graded: set[str] = set()
        #: the eval-mode runs whose output carried a gradient since the last step: (module
        #: path, the line that called it), numbered from ``eval_base`` (the number is kept in
        #: its output node's metadata, so that a backward through that node finds it)
        self.eval_runs: list[tuple[str, str | None]] = []
        self.eval_base = 0
        #: module path -> the line of its eval-mode run a backward went through
        self.graded_at: dict[str, str | None] = {}
        self.backward_lines = BackwardLines()
        self.steps_since_backward = 0
        #: by bit: the gradients a backward after a step added to stale ones (judged at the
        #: next step: ``explain.check_accumulate``)
        self.carried: dict[int, explain.Carried] = {}
        #: the parameters (ids) of the other optimizers that stepped in the block
        self.others: set[int] = set()
        #: over the block's backward() calls: how many, the parameters that got a gradient
        #: (bits), and the roots' lineage (dep, live, cuts) OR-ed together
        self.plain_backwards = 0
        self.got_grad = 0
        self.root_tags = (0, 0, 0)
        self.mode: _DoctorMode | None = None
        self.paused_for: list[Any] = []  # torch.compile wrappers running with the mode off
        #: each compiled region's module, and the inputs (args, kwargs) of the latest call of
        #: each compiled module of ``model`` (held until the block ends: a parameter cut
        #: inside is looked for by running the module again)
        self.regions: dict[Site, torch.nn.Module] = {}
        self.region_inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any],
                                            list[tuple[str, torch.dtype]]]] = {}
        self._said: set[tuple[Any, ...]] = set()
        #: grad_fn -> graph node id of the graph ``trace`` drew (held until the block ends)
        self._ids: dict[Any, str] = {}
        self.handle = HookHandle()

    @property
    def names(self) -> list[str]:
        """The watched parameters' names by bit (``Watched.names``)."""
        return self.watched.names

    # ---------------------------------------------------------------- the block
    def __enter__(self) -> Doctor:
        mode = _DoctorMode(self.bits, self._backward, self.module_now, self.params,
                           on_error=self._forward_error)
        mode.modules = self.stack  # the module of each call: the top of the stack,
        mode.path_of = self.module_path  # named when a finding needs it
        self.mode = mode
        try:
            self.handle.add(_ModuleCalls(self, mode).install())
            for m in self.compiled:  # a compiled module: its inputs, keywords too
                self.handle.add(m.register_forward_hook(self._region_call,
                                                        with_kwargs=True).remove)
            if self.optimizer is not None:
                self.handle.add(self.optimizer.register_step_pre_hook(self._pre_step))
                self.handle.add(self.optimizer.register_step_post_hook(self._post_step))
                # every other optimizer's step: the parameters it holds are not "outside"
                self.handle.add(register_optimizer_step_post_hook(
                    self._other_step))
            mode.__enter__()
        except BaseException:
            self.handle.remove()
            raise
        self.handle.add(lambda: mode.__exit__(None, None, None))
        return self

    def __exit__(self, etype: Any, exc: BaseException | None, tb: Any) -> None:
        judge = exc is None and self.plain_backwards and self.mode is not None
        try:  # with the hooks and the mode still on: the compiled regions' insides
            inside = self._look_inside() if judge else {}
        finally:
            self.handle.remove()
            if self.mode is not None:  # frames of module calls that never ended (none held)
                self.mode.calls.clear()
                self.mode.call_lines.clear()
        try:
            if judge and self.mode is not None:
                for finding in explain.check_grad_none(self.watched, self.mode, self.got_grad,
                                                       self.root_tags, self.called_all(),
                                                       inside):
                    self.add(finding)
            if isinstance(exc, RuntimeError) and not isinstance(exc, AutogradError):
                kind = torch_error_kind(str(exc))
                if kind == "inplace_forward":  # in a call the mode did not see (.apply)
                    at = _raised_at(exc)
                    finding = explain.forward_inplace(str(exc), at, None)
                    self.add(finding, key=(kind, finding.line, len(self.findings)))
                    raise AutogradError(str(exc), finding) from exc
                if kind is not None:  # a backward the doctor did not run (a C++ extension...)
                    finding = self._explain(kind, exc, [], None)
                    raise AutogradError(str(exc), finding) from exc
        finally:
            self._ids = {}  # the traced graph's nodes are not kept past the block
            self.regions, self.region_inputs = {}, {}
            if self.mode is not None:
                self.mode.close()

    # ---------------------------------------------------------------- the graph
    def trace(self, outputs: Any, **options: Any) -> Graph:
        """``gs.trace(outputs, model=<the doctor's model>, **options)``, in the block before
        ``backward()``: the doctor remembers which autograd node is which node of this graph,
        so that a finding made afterwards names its nodes there (``Site.node``: the node that
        saved the tensor, the node the in-place op made; ``Finding.nodes``).
        ``gradscope render --doctor`` draws them highlighted."""
        if self.model is not None:
            options.setdefault("model", self.model)
        graph, ids = trace_with_ids(outputs, **options)
        self._ids = ids
        return graph

    def node_id(self, fn: Any) -> str | None:
        """The graph node id of autograd node ``fn`` in the graph ``trace`` drew (None when
        nothing was traced, or ``fn`` is not in it)."""
        return self._ids.get(fn) if fn is not None and self._ids else None

    def module_now(self) -> str | None:
        """The path of the module whose call runs now (None: none of the model's)."""
        return self.module_path(self.stack[-1]) if self.stack else None

    def module_path(self, key: Any) -> str | None:
        """The path of the model's module with id ``key`` (``encoder.layers.3``; a path or
        None: itself). The paths are walked when first asked for, not for every block: a
        module the block removed from the model by then has none."""
        if not isinstance(key, int):
            return key
        if self._paths is None:
            self._paths = ({id(m): name for name, m in dynamo.named_modules(self.model)}
                           if self.model is not None else {})
        return self._paths.get(key)

    # ---------------------------------------------------------------- results
    def report(self) -> DoctorReport:
        """The findings as a plain ``DoctorReport`` (``.render()``: a rich renderable)."""
        return DoctorReport(tuple(self.findings), self.backwards, self.steps, tuple(self.notes))

    @property
    def notes(self) -> list[str]:
        """Why the doctor stopped watching part of the block (a tensor it cannot read), if it
        did: its findings then cover only what it saw before."""
        failure = self.mode.failure if self.mode is not None else None
        return [failure] if failure else []

    def findings_json(self) -> str:
        """The findings as JSON text (``{"gradscope_doctor": 1, "findings": [...]}``)."""
        return findings_json(self.findings)

    def add(self, finding: Finding, key: tuple[Any, ...] | None = None) -> None:
        """Keep ``finding`` (once per ``key``: the same slip seen at every step is one)."""
        key = key if key is not None else (finding.kind, finding.param, finding.line)
        if key in self._said:
            return
        self._said.add(key)
        self.findings.append(finding)

    # ---------------------------------------------------------------- module hooks
    def _pre_module(self, module: Any, args: Any, frame: Any) -> None:
        """A module call starts (``_ModuleCalls._pre``, which does the same, inline;
        ``frame``: torch's frame that calls its hooks and its forward)."""
        inner = unwrap(module) if type(module).__name__ == _WRAPPER else None
        key = id(inner if inner is not None else module)
        name = key if key in self.in_model else None
        self.stack.append(name)
        mode = self.mode
        # the mode finds the user's line of the calls inside once per module call
        # (``_DoctorMode.line_of``)
        if mode is not None:
            mode.calls.append(frame if frame is not None
                              and torch_internal(frame.f_code.co_filename) else None)
            mode.call_lines.append(_UNSET)
        if name is not None and name not in self.ran:
            self._first_run(module, name, frame)
        # Dynamo guards on the mode stack: off while a compiled module runs (no recompile)
        if inner is not None and mode is not None and dynamo.mode_on_top(mode):
            dynamo.pop_mode()
            self.paused_for.append(module)

    def _first_run(self, module: Any, name: int, frame: Any) -> None:
        """The first run since the last step of the module with id ``name``: its training
        flag, the line (read only for a module in eval mode: ``explain.check_step``)."""
        self.ran[name] = _TRAINING if module.training else (False, _line(frame))

    def called_all(self) -> _Paths:
        """The paths of every module that ran in the block (``called``, and ``ran`` since
        the last step), named when first read."""
        return _Paths(self.called | self.ran.keys(), self.module_path)

    def _post_module(self, module: Any, args: Any, output: Any) -> None:
        """A module call ends (``_ModuleCalls._post``)."""
        mode = self.mode
        if self.paused_for and self.paused_for[-1] is module and mode is not None:
            self.paused_for.pop()
            dynamo.push_mode(mode)
            inner = dynamo.unwrap(module)
            own = mask_of(self.bits[id(p)] for p in inner.parameters() if id(p) in self.bits)
            at = Site("compiled", type(inner).__name__, _here(), self.module_now())
            mode.region(args, output, own, at)  # the region as one call: lineage goes on
            self.regions[at] = inner
        if self.stack:
            name = self.stack.pop()
            if mode is not None and mode.calls:
                mode.calls.pop()
                mode.call_lines.pop()
            path = (self.module_path(name) if name is not None and not module.training
                    else None)
            if (path is not None and isinstance(output, torch.Tensor)
                    and output.requires_grad and output.grad_fn is not None):
                meta = torchcompat.node_metadata(output.grad_fn)
                if meta is not None:  # the node is marked: found again by walking a backward
                    meta.setdefault(_EVAL_KEY, []).append(len(self.eval_runs) + self.eval_base)
                    self.eval_runs.append((path, _here()))

    def _look_inside(self) -> dict[Site, int]:
        """For each compiled region on the path of a parameter left without a gradient: its
        module run once more, uncompiled, on its latest inputs, with the mode recording (what
        it reached put back: parameters, buffers reassigned or changed, plain attributes, its
        own generators, torch's, Python's and NumPy's RNG; nothing backpropagated), and the
        lineage cuts of what it returned (``CutEvent`` bits): where inside it the path was
        cut. A region that cannot run again (a compiled module outside ``model``, whose
        keyword inputs the doctor does not see, or one that raises) is left out."""
        mode = self.mode
        assert mode is not None
        if not mode.compiled_use:  # no compiled region on any parameter's path
            return {}
        paused, mode.paused = mode.paused, True  # reading requires_grad is not the model's
        try:
            got = bit_text(self.got_grad, len(self.params))
            missing = {bit for bit, p in enumerate(self.params)
                       if got[bit] == "0" and p.requires_grad}
        finally:
            mode.paused = paused
        wanted = {site for bit, site in mode.compiled_use.items() if bit in missing}
        if not wanted:
            return {}
        found: dict[Site, int] = {}
        for site in wanted:
            module = self.regions.get(site)
            held = self.region_inputs.get(id(module)) if module is not None else None
            if module is not None and held is not None:
                cuts = _run_again(mode, module, *held)
                if cuts is not None:
                    found[site] = cuts
        return found

    def _region_call(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        # the autocast settings the call ran under (a hook runs inside them): the same again
        self.region_inputs[id(dynamo.unwrap(module))] = (args, kwargs, autocast_now())

    # ---------------------------------------------------------------- backward
    def _backward(self, func: Any, args: Any, kwargs: Any) -> Any:
        """Run one backward call for the mode: checks before, explanation on error, the
        parameters without a gradient after."""
        assert self.mode is not None
        line = _line(sys._getframe(2))  # 2: the mode's frame, then the user's call
        plain = func is not torch.autograd.grad and kwargs.get("inputs") is None
        roots = explain.roots_of(func, args, kwargs)
        if self.carried:
            self.carried = explain.still_carried(self.watched, self.carried)
        stale = (explain.stale_grads(self.watched, self.optimizer)
                 if self.optimizer is not None and self.steps_since_backward else {})
        if self.eval_runs:
            self._eval_reached(roots)
        try:
            result = func(*args, **kwargs)
        except RuntimeError as exc:
            kind = torch_error_kind(str(exc))
            if kind is None:
                raise
            finding = self._explain(kind, exc, roots, line)
            raise AutogradError(str(exc), finding) from exc
        self.mode.iteration += 1
        self.backwards += 1
        self.backward_lines.add(line, explain.retains_graph(func, args, kwargs))
        self.steps_since_backward = 0
        if stale:
            self.carried.update(explain.added_to(self.watched, stale, line))
        if plain and self.params:
            self._note_backward(roots)
        return result

    def _note_backward(self, roots: list[Any]) -> None:
        """After a good ``backward()``: which parameters got a gradient, and the roots'
        lineage, OR-ed over the block's backward calls (``grad_none`` is judged on them)."""
        assert self.mode is not None
        self.plain_backwards += 1
        self.got_grad |= mask_of(bit for bit, p in enumerate(self.params)
                                 if p.grad is not None)
        dep, live, cuts = self.root_tags
        for t in roots:
            d, lv, c = self.mode.tag(t)
            dep |= d
            live |= lv
            cuts |= c
        self.root_tags = (dep, live, cuts)

    def _eval_reached(self, roots: list[Any]) -> None:
        """The modules that ran in eval mode whose output this backward goes through: they
        ran in the step that trains (``graded``)."""
        for fn in walk_nodes(t.grad_fn for t in roots if t.grad_fn is not None):
            meta = getattr(fn, "metadata", None)  # the doctor stamped each node made here
            for number in (meta.get(_EVAL_KEY, ()) if isinstance(meta, dict) else ()):
                at = number - self.eval_base
                if 0 <= at < len(self.eval_runs):
                    name, line = self.eval_runs[at]
                    self.graded.add(name)
                    self.graded_at.setdefault(name, line)

    def _forward_error(self, exc: RuntimeError, name: str, args: Any,
                       caller: Any) -> BaseException | None:
        """An in-place op torch refused in the forward (a leaf, a view of a leaf, an output of
        unbind/split, a custom Function's view...): the error to raise in its place, torch's
        own message explained (None for any other error, which passes through)."""
        if forward_error_reason(str(exc)) is None:
            return None
        site = Site("modified", name, _line(caller), self.module_now())
        made = None
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        rec = explain.record_of(self.mode, target.grad_fn) if (
            target is not None and self.mode is not None) else None
        if rec is not None:
            made = Site("made", rec.op, rec.site.line, rec.site.module)
        finding = explain.forward_inplace(str(exc), site, made)
        self.add(finding, key=(finding.kind, finding.line, len(self.findings)))
        return AutogradError(str(exc), finding)

    def _explain(self, kind: str, exc: BaseException, roots: list[Any],
                 line: str | None) -> Finding:
        assert self.mode is not None
        finding = explain.explain_error(self.watched, self.mode, kind, str(exc), roots, line,
                                        self.backward_lines, self.node_id)
        self.add(finding, key=(kind, finding.line, len(self.findings)))
        return finding

    # ---------------------------------------------------------------- optimizer hooks
    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        line = _here()
        if self.mode is not None:
            self.mode.paused = True  # neither the update nor the doctor's checks are the model's
        # an eval-mode run a backward went through: named at that run's line
        ran: dict[str, tuple[bool, str | None]] = {}
        for module, run in self.ran.items():  # those in eval mode: named
            path = self.module_path(module) if not run[0] else None
            if path is not None:
                ran[path] = run
        ran.update((n, (False, at)) for n, at in self.graded_at.items())
        for finding, key in explain.check_step(self.watched, optimizer, line, ran,
                                               self.others, self.graded):
            self.add(finding, key)
        for finding, key in explain.check_accumulate(self.watched, optimizer, self.carried):
            self.add(finding, key)
        self.carried.clear()
        self.called.update(self.ran)
        self.ran.clear()
        self.graded.clear()
        self.graded_at.clear()
        self.eval_base += len(self.eval_runs)
        self.eval_runs.clear()

    def _other_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is not self.optimizer:
            self.others.update(id(p) for g in optimizer.param_groups for p in g["params"])

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        self.steps_since_backward += 1
        if self.mode is not None:
            self.mode.paused = False

    # ---------------------------------------------------------------- naming
    def param_site(self, bit: int) -> str | None:
        """The module path that owns parameter ``bit`` (None for a parameter of the root)."""
        return self.watched.param_site(bit)


class _ModuleCalls(ModuleHooks):
    """The doctor's global module hooks: ``ModuleHooks``' handling of ``torch.compile``, with
    the doctor's bookkeeping (``Doctor._pre_module`` / ``_post_module``) called from the hooks
    themselves, and torch's frame that calls them handed over (read here, not walked to).
    A module of the model that runs in training mode, the common case by thousands a step, is
    kept here inline (the stacks it touches read once, when the block starts)."""

    def __init__(self, doctor: Doctor, mode: _DoctorMode) -> None:
        super().__init__(doctor._pre_module, doctor._post_module)
        self.doctor = doctor
        self.in_model = doctor.in_model
        self.stack = doctor.stack
        self.ran = doctor.ran
        self.calls = mode.calls
        self.call_lines = mode.call_lines
        self.caller: Any = None  # the code of torch's frame that calls the hooks, once seen

    def _pre(self, module: Any, args: Any) -> None:
        if compiling():
            return None
        callbacks = self.callbacks
        if callbacks is None:
            if _DYNAMO in sys.modules:  # ``dynamo.dynamo_loaded()``
                self._arm()  # torch._dynamo imported since install
        elif callbacks[0] not in self.handler.start_callbacks:
            self._arm()  # reset() cleared the callbacks
        name = id(module)
        frame = sys._getframe(1)
        if name not in self.in_model:  # a compile wrapper, a module outside the model
            self.doctor._pre_module(module, args, frame)
            return None
        # ``Doctor._pre_module`` for a module of the model, inline
        self.stack.append(name)
        code = frame.f_code
        if code is self.caller or torch_internal(code.co_filename):
            self.caller = code
            self.calls.append(frame)
        else:
            self.calls.append(None)
        self.call_lines.append(_UNSET)
        ran = self.ran
        if name not in ran:  # ``Doctor._first_run``
            ran[name] = _TRAINING if module.training else (False, _line(frame))
        return None

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if compiling():
            return None
        doctor = self.doctor
        if doctor.paused_for or not module.training or not self.stack:  # the whole of it
            doctor._post_module(module, args, output)
            return None
        # ``Doctor._post_module`` for a module in training mode outside compiled ones
        self.stack.pop()
        if self.calls:
            self.calls.pop()
            self.call_lines.pop()
        return None


class _Paths(Collection[str]):
    """Module paths from module ids, named when first read (``Doctor.called_all``)."""

    def __init__(self, keys: set[int], path: Callable[[int], str | None]) -> None:
        self.keys = keys
        self.path = path
        self.paths: frozenset[str] | None = None

    def _named(self) -> frozenset[str]:
        if self.paths is None:
            named = (self.path(k) for k in self.keys)
            self.paths = frozenset(p for p in named if p is not None)
        return self.paths

    def __contains__(self, item: object) -> bool:
        return item in self._named()

    def __iter__(self) -> Iterator[str]:
        return iter(self._named())

    def __len__(self) -> int:
        return len(self._named())


_PLAIN = (torch.Tensor, int, float, bool, complex, str, type(None))


@contextlib.contextmanager
def _attributes_kept(module: torch.nn.Module) -> Any:
    """The plain attributes of ``module`` and its submodules (tensors that are not buffers,
    numbers, strings: ``self.last = x.mean()``, ``self.calls += 1``) as they were when the
    block ends; a tensor attribute the block added is removed."""
    kept = [(m, {k: v for k, v in vars(m).items() if isinstance(v, _PLAIN)})
            for m in module.modules()]
    try:
        yield
    finally:
        for m, attrs in kept:
            now = vars(m)
            for k in [k for k, v in now.items() if isinstance(v, torch.Tensor)
                      and k not in attrs]:
                del now[k]
            for k, v in attrs.items():
                if now.get(k, _PLAIN) is not v:
                    now[k] = v


def _raised_at(exc: BaseException) -> Site | None:
    """The user's line ``exc`` was raised from (the innermost frame of its traceback outside
    torch and gradscope), as a ``modified`` site; None when there is none."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if user_frame(tb.tb_frame) is tb.tb_frame:
            line = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return Site("modified", None, line) if line is not None else None


def _run_again(mode: _DoctorMode, module: torch.nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], autocast: list[tuple[str, torch.dtype]]) -> int | None:
    """The cut-event bits of ``module(*args, **kwargs)`` run eagerly under ``mode`` and the
    ``autocast`` settings of its call (see ``Doctor._look_inside``), or None when it raised."""
    from ..memory.untouched import restored  # puts back what the run reached (see below)

    devices = sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
    paused = mode.paused
    mode.paused = True  # the doctor's own copies are not the model's calls
    try:
        # the parameters' values and .grad, buffers (a reassigned one put back as the same
        # object, one changed in place copied back only if it changed), the module's own
        # torch.Generators, torch's, Python's and NumPy's RNG states: as they were
        with contextlib.ExitStack() as stack:
            stack.enter_context(restored(module, None))
            stack.enter_context(_attributes_kept(module))
            stack.enter_context(torch.random.fork_rng(devices=devices))
            stack.enter_context(torch.enable_grad())
            for device_type, dtype in autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            mode.paused = False
            try:
                # copies of the tensor inputs (the mode follows their lineage through clone):
                # an in-place op inside writes to them, never to the step's own tensors again
                args, kwargs = tree_map(
                    lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
                out = module(*args, **kwargs)
            finally:
                mode.paused = True  # putting things back is not the model's calls either
            cuts = 0
            for t in _outputs(out):
                cuts |= mode.tag(t)[2]
        return cuts
    except Exception:  # it needs state gone by now: the region stays unseen
        return None
    finally:
        mode.paused = paused


def doctor(model: torch.nn.Module | None = None,
           optimizer: torch.optim.Optimizer | None = None) -> Doctor:
    """Watch a forward and backward (one training step or several) and explain what autograd
    refused or silently skipped.

    In the block, an autograd error torch raises in backward (a tensor saved for backward and
    then modified in place, a second backward through a freed graph, a loss without a graph)
    comes out as ``gs.AutogradError``: torch's own message first, then the finding (the ops and
    lines that saved and modified the tensor, the tensor carried from an earlier iteration, the
    line where the loss lost its graph). It is a ``RuntimeError`` too, so ``except
    RuntimeError`` still catches it. After each good ``backward()``, every parameter of
    ``model`` that requires grad and got none is a ``grad_none`` finding saying why (``unused``,
    ``no_grad``, ``cut`` with the op and line of the cut, ``frozen_upstream``, ``compiled``
    when the cut is inside a ``torch.compile``d module, which the doctor does not see into). With
    ``optimizer``, each ``step()`` is checked: parameters with gradients in no param group,
    frozen ones in a group, gradients carried over from the last step (no ``zero_grad``), and
    dropout/normalisation modules left in ``eval()`` mode.

    Args:
        model: the ``nn.Module`` whose parameters are watched (module paths come from it).
        optimizer: the optimizer whose ``step()`` the block calls.

    Returns:
        A context manager; ``.findings`` (``Finding`` records), ``.findings_json()``,
        ``.report()`` (a ``DoctorReport``, ``.render()`` for a rich renderable).

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        >>> with gs.doctor(net) as doc:
        ...     with torch.no_grad():
        ...         h = net[0](torch.randn(2, 4))
        ...     net[1](h).sum().backward()
        >>> [(f.kind, f.reason, f.param) for f in doc.findings]
        [('grad_none', 'no_grad', '0.weight'), ('grad_none', 'no_grad', '0.bias')]
    """
    return Doctor(model, optimizer)
