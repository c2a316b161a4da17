"""The autograd doctor's explanations: from what ``doctor_record`` kept to ``Finding`` records.

Each function is given the plain pieces it reads (``Watched``: the watched parameters by bit;
the recording mode; the lines and flags the caller keeps) and returns findings; it writes no
one's state. ``doctor.Doctor`` owns every piece and keeps the findings.

- ``explain_error``: torch's ``inplace`` / ``backward_twice`` / ``no_grad_fn`` errors, read back
  against the failing graph's own nodes (their ``NodeRecord`` stamps) and the lineage.
- ``check_grad_none``: after the block's ``backward()`` calls, every watched parameter that
  requires grad and got no ``.grad``, with the reason.
- ``check_step`` / ``check_accumulate``: the training loop, at ``optimizer.step()`` (each
  finding with the key it is said once under); ``stale_grads`` / ``added_to`` /
  ``still_carried`` follow, around each backward after a step, the gradients that backward
  added to ones left from before the step, which ``check_accumulate`` finds at the next step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import torch

from .._torch import dynamo, torchcompat
from .._torch.stamps import walk_nodes
from ..graph.nodes import plural
from .findings import (
    Finding,
    Site,
    describe_tensor,
    forward_error_reason,
    names,
    parse_inplace,
)
from .recorder import (
    BackwardLines,
    CutEvent,
    NodeRecord,
    SavedRecord,
    _DoctorMode,
    bit_text,
    bits_of,
)


@dataclass(frozen=True)
class Watched:
    """The parameters a doctor watches: ``names`` and ``params`` by bit, ``bits`` from
    ``id(parameter)`` to its bit, and the model they belong to (None: none watched).

    ``names`` are joined when first asked for (a finding names a parameter) from ``parts``,
    the owning module and the parameter's key by bit, kept when the block starts (``listed``:
    the names themselves, where the model lists its own): the forward needs only ``bits``,
    and a model's thousands of names are not built for every block that finds nothing."""

    model: torch.nn.Module | None
    params: list[torch.Tensor]
    bits: dict[int, int]
    listed: list[str] | None = None
    parts: tuple[list[torch.nn.Module], list[str]] | None = None

    @classmethod
    def of(cls, model: torch.nn.Module | None,
           modules: list[torch.nn.Module] | None = None) -> Watched:
        """The parameters of ``model`` as ``model.named_parameters()`` lists them;
        ``modules``: ``modules_of(model)`` where the caller has it (one walk of a model of
        thousands of modules, not two)."""
        params: list[torch.Tensor] = []
        bits: dict[int, int] = {}
        if model is None:
            return cls(None, params, bits, listed=[])
        if modules is None:
            modules = modules_of(model)
        kind = type(model)
        if (modules is None or kind.named_parameters is not torch.nn.Module.named_parameters
                or kind._named_members is not torch.nn.Module._named_members):
            named = list(model.named_parameters())
            for _, p in named:
                bits[id(p)] = len(params)
                params.append(p)
            return cls(model, params, bits, listed=_user_names(name for name, _ in named))
        # ``named_parameters()``'s order and de-duplication, read off the modules' own dicts
        owners: list[torch.nn.Module] = []
        keys: list[str] = []
        for module in modules:
            held = module._parameters
            if held:
                for key, param in held.items():
                    if param is not None and id(param) not in bits:
                        bits[id(param)] = len(params)
                        params.append(param)
                        owners.append(module)
                        keys.append(key)
        return cls(model, params, bits, parts=(owners, keys))

    @cached_property
    def names(self) -> list[str]:
        """The parameters' names by bit, as the user names them (``fc1.weight``)."""
        if self.listed is not None:
            return self.listed
        owners, keys = self.parts or ([], [])
        paths = ({id(m): name for name, m in self.model.named_modules()}
                 if self.model is not None else {})
        joined = []
        for owner, key in zip(owners, keys):
            path = paths.get(id(owner), "")  # "": a module the block took out of the model
            joined.append(f"{path}.{key}" if path else key)
        return _user_names(joined)

    def param_site(self, bit: int) -> str | None:
        """The module path that owns parameter ``bit`` (None for a parameter of the root)."""
        name = self.names[bit]
        return name.rsplit(".", 1)[0] if "." in name else None


_MODULE_WALK = torch.nn.Module.named_modules


def modules_of(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """``model``'s modules in the order ``model.named_modules()`` lists them, each once,
    walked without their names (a stack, no generator per module, no path strings: a model
    of thousands of modules is walked in a third of the time); None where a module has its
    own ``named_modules``."""
    found = []
    seen: set[int] = set()
    stack = [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        if type(module).named_modules is not _MODULE_WALK:
            return None
        seen.add(id(module))
        found.append(module)
        children = module._modules
        if children:
            below = [child for child in children.values() if child is not None]
            below.reverse()  # popped in their order
            stack.extend(below)
    return found


def _user_names(names: Any) -> list[str]:
    """``_orig_mod.fc1.weight`` -> ``fc1.weight`` (``dynamo.plain_name``), for each name."""
    return [name if "_orig_mod" not in name else dynamo.plain_name(name) for name in names]


#: A finding and the key it is said once under (``Doctor.add``).
Keyed = tuple[Finding, tuple[Any, ...]]
#: Graph node id of an autograd node in the graph the doctor traced (``Doctor.node_id``).
NodeId = Callable[[Any], "str | None"]


_WHY = {
    "no_grad": "ran under torch.no_grad()",
    "inference_mode": "ran under torch.inference_mode()",
    "detach": "returns a tensor without a graph (.detach())",
    "data": "returns a tensor without a graph (.data)",
    "item": "turns the tensor into a Python value, which carries no graph",
    "integer": "returns integers or booleans (argmax, a comparison, an integer cast), "
               "through which no gradient flows",
    "nondiff": "is not differentiable, so no gradient flows through it",
    "indices": "returns these indices without a gradient (only its values output carries "
               "one), and the path went on through the indices",
    "nondiff_output": "returns this output without a gradient (only its other outputs carry "
                      "one), and the path went on through it",
    "marked_nondiff": "returns this output marked non-differentiable "
                      "(ctx.mark_non_differentiable in its forward), so no gradient flows "
                      "through it",
}
_CUT_FIX = {
    "no_grad": "run it outside torch.no_grad() / inference_mode() if its parameters should "
               "learn; if they should not, set requires_grad_(False) on them",
    "detach": "drop the .detach() (or keep it and freeze those parameters on purpose with "
              "requires_grad_(False))",
    "data": "use the tensor itself instead of .data",
    "item": "keep the value a tensor (no .item() / .tolist() / .numpy()) so that the graph "
            "goes on",
    "integer": "use a differentiable stand-in (softmax or a straight-through estimator "
               "instead of argmax, a float mask instead of a comparison)",
    "nondiff": "use a differentiable op in its place",
    "indices": "use the values output (torch.max(x, dim).values, sort's or topk's values), "
               "not the indices, where the gradient should flow; for a soft choice weigh by "
               "softmax instead of picking by index",
    "nondiff_output": "use the output that carries a gradient where the parameters before "
                      "it should learn",
    "marked_nondiff": "don't mark that output non-differentiable (drop it from "
                      "ctx.mark_non_differentiable and return its gradient from backward) if "
                      "the parameters before it should learn through it",
}
_CUT_FIX["inference_mode"] = _CUT_FIX["no_grad"]
_MODE_MODULES = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm,
                 torch.nn.modules.instancenorm._InstanceNorm)


def retains_graph(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether a ``backward()`` / ``torch.autograd.backward`` / ``torch.autograd.grad`` call
    keeps its graph (``retain_graph``, which defaults to ``create_graph``)."""
    at = 3 if func is torch.autograd.grad else 2  # (outputs, inputs, grad_outputs, retain)
    retain = kwargs.get("retain_graph", args[at] if len(args) > at else None)
    if retain is None:
        create = kwargs.get("create_graph", args[at + 1] if len(args) > at + 1 else False)
        return bool(create)
    return bool(retain)


def roots_of(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors a backward call starts from."""
    first = args[0] if args else kwargs.get("outputs", kwargs.get("tensors"))
    items = first if isinstance(first, (list, tuple)) else [first]
    return [t for t in items if isinstance(t, torch.Tensor)]


def record_of(mode: _DoctorMode, fn: Any) -> NodeRecord | None:
    """The doctor's ``NodeRecord`` of autograd node ``fn`` (None: not one it saw made)."""
    return mode.node_record(fn) if fn is not None else None


def _where(site: Site | None) -> str:
    if site is None or site.line is None:
        return ""
    return f" at {site.line}" + (f" ({site.module})" if site.module else "")


def explain_error(watched: Watched, mode: _DoctorMode, kind: str, message: str,
                  roots: list[torch.Tensor], line: str | None, backward_lines: BackwardLines,
                  node_id: NodeId) -> Finding:
    """The finding that explains torch's error ``message`` (of ``kind``) in the backward from
    ``roots`` called at ``line``; ``backward_lines``: the line of each earlier backward."""
    first = (message.strip().splitlines() or [""])[0]
    if kind == "inplace_forward":
        return forward_inplace(message, None, None)
    if kind == "inplace":
        found = _inplace(mode, message, roots, node_id)
    elif kind == "backward_twice":
        found = _backward_twice(mode, roots, line, backward_lines, node_id)
    else:
        found = _no_grad_fn(watched, mode, roots, line)
    return Finding(**{**found, "torch_error": first})


# ---------------------------------------------------------------------------- inplace
def _same_node(creator: str | None, named: str) -> bool:
    """torch names the node ``SigmoidBackward0`` or, in some versions, ``Sigmoid``."""
    if creator is None:
        return False
    return creator == named or creator.rstrip("0123456789").removesuffix("Backward") == named


def _fails_to_unpack(fn: Any, message: str) -> bool:
    """Whether a tensor ``fn`` saved now raises torch's version error, the very ``message``:
    the saver found by identity (torch's message names the tensor's creator NOW, the in-place
    op's node, not the one that made it when it was saved). Reads the documented
    ``_saved_*`` attributes of built-in nodes and a custom Function's ``saved_tensors``."""
    first = message.splitlines()[0] if message else ""
    names = [n for n in dir(fn) if n.startswith("_saved_")]
    if torchcompat.is_custom_ctx(fn):
        names.append("saved_tensors")
    for name in names:
        try:
            getattr(fn, name)
        except RuntimeError as exc:
            if str(exc).splitlines()[:1] == [first]:
                return True
        except Exception:  # an attribute this torch cannot read back: not the one
            continue
    return False


def _raw_saved(fn: Any, shape: tuple[int, ...], version: int) -> list[SavedRecord]:
    """The tensors of ``shape`` a custom Function's node holds, as records at ``version``."""
    try:
        tensors = torchcompat.region_raw_saved(fn)
    except (AttributeError, RuntimeError):
        return []
    found = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and tuple(t.shape) == shape:
            try:
                key: int | None = torchcompat.storage_key(t)
            except (RuntimeError, NotImplementedError, TypeError):
                key = None
            found.append(SavedRecord(key, version, shape, str(t.dtype), None, 0))
    return found


def _inplace(mode: _DoctorMode, message: str, roots: list[torch.Tensor],
             node_id: NodeId) -> dict[str, Any]:
    parsed = parse_inplace(message)
    fix = ("use the out-of-place form (y = y * 2 rather than y *= 2, relu rather than relu_, "
           "inplace=False in modules), or modify a .clone() of the tensor")
    if parsed is None:
        return dict(kind="inplace", message="A tensor saved for backward was modified in place "
                    "afterwards.", op=None, line=None, module=None, fix=fix)
    best: tuple[Any, ...] | None = None
    made_by: dict[int, Any] = {}  # call index -> the newest node that call made
    for fn in walk_nodes(t.grad_fn for t in roots):
        rec = mode.node_record(fn)
        if rec is None:
            continue
        newest = made_by.get(rec.index)
        if newest is None or fn._sequence_nr() > newest._sequence_nr():
            made_by[rec.index] = fn
        identity: bool | None = None  # asked only when a record fits the shape and version
        # a custom Function's node is stamped at .apply, before save_for_backward: what it
        # saved is read from the node itself (without the version check)
        for saved in rec.saved or _raw_saved(fn, parsed.shape, parsed.expected):
            if saved.shape != parsed.shape or saved.version != parsed.expected:
                continue
            if identity is None:
                identity = _fails_to_unpack(fn, message)
            described = parsed.node is None or (_same_node(saved.creator, parsed.node)
                                                and saved.output_nr == parsed.output_nr)
            if not (identity or described):
                continue
            writes = [w for w in mode.writes.get(saved.storage or -1, ())
                      if parsed.expected < w.version <= parsed.found and w.index >= rec.index]
            rank = (identity, bool(writes), fn._sequence_nr())
            if best is None or rank > best[0]:
                best = (rank, rec, fn, writes)
    what = describe_tensor(parsed.tensor_type, parsed.shape, parsed.output_nr, parsed.node)
    if best is None:
        return dict(kind="inplace", message=f"{what[0].upper()}{what[1:]} was saved for backward "
                    f"at version {parsed.expected} and modified in place afterwards (version "
                    f"{parsed.found}); the doctor did not see where.", op=None, line=None,
                    module=None, fix=fix)
    _, rec, saver, writes = best
    saved_site = Site("saved", rec.op, rec.site.line, rec.site.module, node_id(saver))
    text = (f"{what[0].upper()}{what[1:]} was saved for backward by {rec.op}{_where(rec.site)} "
            f"({type(saver).__name__}) at version {parsed.expected}")
    if not writes:
        return dict(kind="inplace", message=text + f", and changed in place afterwards (version "
                    f"{parsed.found} at backward) by an op the doctor did not see.",
                    op=rec.op, line=rec.site.line, module=rec.site.module, fix=fix,
                    sites=(saved_site,))
    w = min(writes, key=lambda x: x.version)
    # the node the in-place op made (its grad_fn: MulBackward0 of mul_, CopySlices of a write
    # through a view), where it is in the failing graph
    modified = replace(w.site, node=node_id(made_by.get(w.index)))
    view = " through a view" if w.shape != parsed.shape else ""
    more = (f"; {plural(len(writes) - 1, 'more in-place change')} followed"
            if len(writes) > 1 else "")
    text += (f"; then {w.site.op}{_where(w.site)} modified it in place{view} (version "
             f"{w.version}){more}, so its backward found version {parsed.found}.")
    return dict(kind="inplace", message=text, op=w.site.op, line=w.site.line,
                module=w.site.module, fix=fix, sites=(modified, saved_site))


# ---------------------------------------------------------------------------- forward
_FORWARD_WHAT = {
    "leaf": "modified in place a leaf tensor that requires grad (a parameter, or a tensor "
            "made with requires_grad=True) while autograd records; torch refuses, since the "
            "leaf's gradient would be that of its new value",
    "leaf_view": "modified in place a view of a leaf tensor that requires grad (a parameter, "
                 "or a tensor made with requires_grad=True) while autograd records",
    "multi_view": "modified in place an output of {maker}, one of several views of one tensor "
                  "(unbind, split, chunk...); autograd cannot rebase such a view, so it "
                  "refuses",
    "custom_view": "modified in place a view that the custom Function {maker} returned; its "
                   "backward would be overridden by the view's, so torch refuses",
    "no_grad_view": "modified in place, with gradients on, a view made under no_grad{made}",
    "inference": "modified in place, outside inference_mode, a tensor made under "
                 "torch.inference_mode(){made}",
}
_FORWARD_FIX = {
    "leaf": "do it under `with torch.no_grad():` (as nn.init and optimizers do) when it sets "
            "the value; if the change should be differentiated, apply it out of place "
            "(w = w * 2) or to a .clone() of the leaf",
    "leaf_view": "do it under `with torch.no_grad():` when it sets the value (initialisation); "
                 "if it should be differentiated, modify a .clone() of the leaf",
    "multi_view": "use the out-of-place op (y = y + 1 rather than y += 1), or .clone() the "
                  "output before changing it in place",
    "custom_view": "clone the output of the custom Function before the in-place op (or return "
                   "a new tensor, not a view of an input, from its forward)",
    "no_grad_view": "make the view and the in-place op both inside the no_grad block (the "
                    "change is not tracked) or both outside it (it is)",
    "inference": "make a .clone() of the tensor outside inference_mode before the in-place "
                 "op, or create it outside inference_mode",
}


def forward_inplace(message: str, site: Site | None, made: Site | None) -> Finding:
    """The finding for an in-place op torch refused in the forward (``message``: its error):
    ``site``, where the in-place op ran (None when the doctor did not see it), ``made``, where
    the tensor it modified was made (the view, the multi-output op, the ``.apply``)."""
    reason = forward_error_reason(message) or "leaf"
    maker = made.op if made is not None and made.op else "the op that made it"
    what = _FORWARD_WHAT[reason].format(
        maker=maker + _where(made), made=f" (by {made.op}{_where(made)})" if made else "")
    if site is None:
        who = "An in-place op the doctor did not see"
    else:
        who = f"{site.op or 'An in-place op'}{_where(site)}"
    first = (message.strip().splitlines() or [""])[0]
    sites = tuple(s for s in (site, made) if s is not None)
    return Finding("inplace_forward", f"{who} {what}.", site.op if site else None,
                   site.line if site else None, site.module if site else None,
                   _FORWARD_FIX[reason], reason=reason, sites=sites, torch_error=first)


# ---------------------------------------------------------------------------- backward twice
def _backward_twice(mode: _DoctorMode, roots: list[torch.Tensor], line: str | None,
                    backward_lines: BackwardLines, node_id: NodeId) -> dict[str, Any]:
    fix_twice = ("pass retain_graph=True to the first backward if a second one through the same "
                 "graph is really wanted, or recompute the forward")
    now = mode.iteration
    starts = [t.grad_fn for t in roots if t.grad_fn is not None]
    old: dict[Any, Any] = {}  # old node -> the newer node that points to it (None: a root)
    for fn in starts:
        rec = mode.node_record(fn)
        if rec is not None and rec.iteration < now:
            old.setdefault(fn, None)

    def enter(fn: Any) -> bool:
        rec = mode.node_record(fn)
        if rec is not None and rec.iteration < now:
            return False  # old: the boundary, not below it
        for nxt, _ in fn.next_functions:
            r = mode.node_record(nxt) if nxt is not None else None
            if r is not None and r.iteration < now:
                old.setdefault(nxt, fn)
        return True

    for _ in walk_nodes(starts, enter=enter):
        pass
    if not old:
        return dict(kind="backward_twice", message="Backward reached a part of the graph whose "
                    "saved tensors were already freed by an earlier backward, made before the "
                    "doctor started watching.", op=None, line=line, module=None, fix=fix_twice,
                    sites=(Site("backward", "backward", line),))
    fn, user = max(old.items(), key=lambda kv: kv[0]._sequence_nr())
    rec = mode.node_record(fn)
    assert rec is not None
    freed_by = backward_lines.freed_from(rec.iteration)
    by = f"the backward at {freed_by}" if freed_by else "an earlier backward"
    if user is None:  # the root itself: the same graph again
        return dict(kind="backward_twice", message=(
            f"This backward runs through the same graph (its root {type(fn).__name__} was made "
            f"by {rec.op}{_where(rec.site)}) that {by} already ran through and freed."),
            op="backward", line=line, module=None, fix=fix_twice,
            sites=(Site("backward", "backward", line), Site("freed", "backward", freed_by)))
    urec = mode.node_record(user)
    used = Site("used", urec.op if urec else type(user).__name__,
                urec.site.line if urec else None, urec.site.module if urec else None,
                node_id(user))
    made = Site("made", rec.op, rec.site.line, rec.site.module, node_id(fn))
    message = (f"A tensor made by {rec.op}{_where(rec.site)} in iteration {rec.iteration + 1} "
               f"(before backward #{rec.iteration + 1}) was carried into this graph"
               f"{' by ' + used.op if used.op else ''}{_where(used)} in iteration {now + 1}; "
               f"its node {type(fn).__name__} belongs to the earlier graph, which {by} "
               "already freed.")
    fix = ("detach what is carried over between iterations (h = h.detach() at the start of "
           "each step, running = running.detach()), or pass retain_graph=True if gradients "
           "should really flow into the earlier step")
    return dict(kind="backward_twice", message=message, op=rec.op, line=rec.site.line,
                module=rec.site.module, fix=fix,
                sites=(made, used, Site("freed", "backward", freed_by)))


# ---------------------------------------------------------------------------- no grad_fn
def _first_event(mode: _DoctorMode, cuts: int, bits: int | None = None) -> tuple[CutEvent, int]:
    events = [mode.events[i] for i in bits_of(cuts)
              if bits is None or mode.events[i].lost & bits]
    events.sort(key=lambda e: e.index)
    return events[0], len(events)


def _no_grad_fn(watched: Watched, mode: _DoctorMode, roots: list[torch.Tensor],
                line: str | None) -> dict[str, Any]:
    dep = cuts = 0
    for t in roots:
        d, _, c = mode.tag(t)
        dep |= d
        cuts |= c
    base = dict(kind="no_grad_fn", module=None)
    if cuts:
        event, count = _first_event(mode, cuts)
        more = f" ({plural(count - 1, 'more such op')} on its path)" if count > 1 else ""
        return {**base, "message": (
            f"The loss has no graph: it depends on the model's parameters through "
            f"{event.site.op}{_where(event.site)}, which {_WHY[event.why]}{more}."),
            "op": event.site.op, "line": event.site.line, "module": event.site.module,
            "fix": _CUT_FIX[event.why], "sites": (event.site,)}
    frozen = [b for b in bits_of(dep) if b in mode.frozen_use]
    if frozen:
        site = mode.frozen_use[frozen[0]]
        return {**base, "message": (
            f"The loss has no graph: every parameter it depends on "
            f"({names([watched.names[b] for b in frozen])}) had requires_grad=False when the "
            f"forward used it (first{_where(site)})."), "op": site.op, "line": site.line,
            "module": site.module, "fix": "set requires_grad_(True) on the parameters that "
            "should learn before the forward", "sites": (Site("frozen", site.op, site.line,
                                                              site.module),)}
    if watched.params and not any(p.requires_grad for p in watched.params):
        return {**base, "message": "The loss has no graph: every parameter of the model is "
                "frozen (requires_grad=False).", "op": None, "line": line,
                "fix": "unfreeze the parameters that should learn (requires_grad_(True))"}
    return {**base, "message": (
        "The loss has no graph: it depends on no parameter that requires grad (computed from "
        "inputs and constants only, or from tensors made before the doctor started)."),
        "op": None, "line": line, "fix": "compute the loss from the model's output, inside "
        "the block, with gradients enabled"}


# ---------------------------------------------------------------------------- grad None
def check_grad_none(watched: Watched, mode: _DoctorMode, got_grad: int,
                    root_tags: tuple[int, int, int],
                    ran: Collection[str],
                    inside: dict[Site, int] | None = None) -> list[Finding]:
    """When the block ends: a ``grad_none`` finding for every watched parameter that requires
    grad and got no gradient from any of the block's ``backward()`` calls (``got_grad``: the
    bits of those that did; ``root_tags``: the lineage of the roots, OR-ed; ``ran``: the paths
    of the modules that ran anywhere in the block, before its optimizer steps too)."""
    found: list[Finding] = []
    got = bit_text(got_grad, len(watched.params))
    missing = [b for b, p in enumerate(watched.params) if got[b] == "0" and p.requires_grad]
    dep, live, cuts = root_tags
    for bit in missing:
        mask = 1 << bit
        name = watched.names[bit]
        owner = watched.param_site(bit)
        region = mode.compiled_use.get(bit)
        hit = [i for i in bits_of(cuts) if mode.events[i].lost & mask]
        # the path reaches the loss (live), or reached it only through compiled code whose
        # output came out without a graph: the cut is inside that region
        if region is not None and (live & mask or (dep & mask and not hit)):
            cut_inside = (inside or {}).get(region, 0)
            if any(mode.events[i].lost & mask for i in bits_of(cut_inside)):
                event, _ = _first_event(mode, cut_inside, mask)  # seen in the uncompiled run
                found.append(_cut(name, event, region))
            else:  # cut inside compiled code it could not run again
                found.append(_in_compiled(name, region))
            continue
        if live & mask:
            continue  # on the loss's gradient path: a hook or inputs= kept it away
        if not dep & mask:
            found.append(_unused(mode, bit, name, owner, ran))
            continue
        if hit:
            event, _ = _first_event(mode, cuts, mask)
            found.append(_cut(name, event))
            continue
        site = mode.frozen_use.get(bit)
        if site is None:  # cut by nothing the doctor saw (a tensor made outside the block)
            found.append(Finding(
                "grad_none", f"{name} influences the loss, but no gradient path from the loss "
                "reaches it, and the doctor did not see the op that cut it (a tensor made "
                "before the block, or by code it does not watch); its .grad stayed None.",
                None, None, owner, "compute the path from the parameter to the loss inside "
                "the block, with gradients enabled and without .detach()", reason="cut",
                param=name))
            continue
        found.append(Finding(
            "grad_none", f"{name} influences the loss, but it had requires_grad=False when "
            f"the forward used it{_where(site)} (frozen then, unfrozen since), so no graph "
            "reaches it; its .grad stayed None.", site.op if site else None,
            site.line if site else None, site.module if site else owner,
            "unfreeze it before the forward (requires_grad_(True) before the step, not after)",
            reason="frozen_upstream", param=name,
            sites=(Site("frozen", site.op, site.line, site.module),) if site else ()))
    return found


def _cut(name: str, event: CutEvent, region: Site | None = None) -> Finding:
    """``event`` cut ``name``'s path (``region``: inside that compiled region, seen when the
    doctor ran its module again uncompiled)."""
    reason = "no_grad" if event.why in ("no_grad", "inference_mode") else "cut"
    within = "" if region is None else (
        f" inside the torch.compile'd {region.op}{_where(region)} (seen by running its "
        "module once more, uncompiled, after the step)")
    sites = (event.site,) if region is None else (event.site, region)
    return Finding(
        "grad_none", f"{name} influences the loss, but only through "
        f"{event.site.op}{_where(event.site)}{within}, which {_WHY[event.why]}; its .grad "
        "stayed None.", event.site.op, event.site.line, event.site.module,
        _CUT_FIX[event.why], reason=reason, param=name, sites=sites)


def _in_compiled(name: str, region: Site) -> Finding:
    return Finding(
        "grad_none", f"{name} got no gradient; its path to the loss goes through the "
        f"torch.compile'd {region.op}{_where(region)}, whose inside the doctor does not see "
        "and could not run again uncompiled (a compiled module outside the model, or it "
        "raised), so the op that cut it cannot be named (a .detach(), .data, no_grad or an "
        "integer op in that forward are the usual causes); its .grad stayed None.",
        region.op, region.line, region.module, "run the step once without torch.compile "
        "under the doctor to name the op (gradscope doctor FILE on an uncompiled copy)",
        reason="compiled", param=name,
        sites=(region,))


def _unused(mode: _DoctorMode, bit: int, name: str, owner: str | None,
            modules_ran: Collection[str]) -> Finding:
    site = mode.use_site(bit)
    ran = owner is None or owner in modules_ran or any(
        k == owner or k.startswith(owner + ".") for k in modules_ran)
    fix = ("call the module in the forward and use its output in the loss, or remove it "
           "(or freeze it with requires_grad_(False) if it is meant to sit out)")
    if site is not None:
        return Finding("grad_none", f"{name} was used by {site.op}{_where(site)}, but that "
                       "output never reached the loss (dropped, or overwritten); its .grad "
                       "stayed None.", site.op, site.line, site.module, fix, reason="unused",
                       param=name, sites=(Site("used", site.op, site.line, site.module),))
    what = (f"module {owner} was never called in the step" if not ran and owner else
            "no op of the forward used it")
    return Finding("grad_none", f"{name} never reached the loss: {what}; its .grad stayed "
                   "None.", None, None, owner, fix, reason="unused", param=name)


# ---------------------------------------------------------------------------- the loop
def check_step(watched: Watched, optimizer: Any, line: str | None,
               ran: dict[str, tuple[bool, str | None]],
               others: set[int] | frozenset[int] = frozenset(),
               graded: set[str] | None = None) -> list[Keyed]:
    """At ``optimizer.step()``: parameters outside every group (of it, and of the ``others``:
    the parameter ids of the other optimizers seen stepping, a GAN's second one), frozen ones
    inside one, and mode-dependent modules left in eval mode (``ran``: the modules that ran
    since the last step, with their training flag and the line that called them; ``graded``:
    those whose output carried a gradient, None: all). A module in eval mode is a slip only
    where the step trains through it: not in a frozen backbone or teacher (no gradient came
    out of it), nor a normalisation layer whose own parameters are frozen (statistics frozen
    on purpose, as in fine-tuning a detector)."""
    found: list[Keyed] = []
    held = {id(p) for g in optimizer.param_groups for p in g["params"]} | others
    outside = [b for b, p in enumerate(watched.params)
               if p.grad is not None and id(p) not in held]
    step = Site("step", "optimizer.step", line)
    if outside:
        listed = [watched.names[b] for b in outside]
        owner = watched.param_site(outside[0])
        found.append((Finding(
            "not_in_optimizer", f"{plural(len(listed), 'parameter')} got gradients but "
            f"{_are(listed)} in no param group of the optimizer, so step() never updates "
            f"{_them(listed)}: {names(listed)}.",
            "optimizer.step", line, owner, "build the optimizer after adding every module "
            "(or optimizer.add_param_group({'params': new_module.parameters()}))",
            param=listed[0], sites=(step,)), ("not_in_optimizer", tuple(listed))))
    bit_of = watched.bits
    # a frozen parameter whose .grad is None is skipped by step(): harmless however it got
    # there (a library's frozen position table, never a gradient, never changed); one that
    # still has a .grad is moved by it
    frozen = [p for g in optimizer.param_groups for p in g["params"]
              if not p.requires_grad and p.grad is not None]
    if frozen:
        listed = [watched.names[bit_of[id(p)]] if id(p) in bit_of
                  else f"a {list(p.shape)} tensor" for p in frozen]
        first = bit_of.get(id(frozen[0]))
        found.append((Finding(
            "frozen_in_optimizer", f"{plural(len(listed), 'frozen parameter')} "
            f"(requires_grad=False) {_are(listed)} in the optimizer's param groups with a "
            f".grad that is not None: {names(listed)}. step() skips {_them(listed)} only "
            f"while {_their(listed)} .grad is None, so it moves {_them(listed)}: the gradient "
            "left from before the freeze (or a zero one: zero_grad(set_to_none=False)), "
            "weight decay and momentum included.", "optimizer.step", line,
            watched.param_site(first) if first is not None else None,
            "hand the optimizer only trainable parameters: "
            "(p for p in model.parameters() if p.requires_grad), or set their .grad to None "
            "when freezing them", param=listed[0],
            sites=(step,)), ("frozen_in_optimizer", tuple(listed))))
    if watched.model is None:
        return found
    modules = dict(dynamo.named_modules(watched.model))
    evals = [(n, at) for n, (training, at) in ran.items()
             if not training and isinstance(modules.get(n), _MODE_MODULES)
             and (graded is None or n in graded) and not _frozen_norm(modules[n])]
    if evals:
        listed = [n or type(watched.model).__name__ for n, _ in evals]
        at = evals[0][1]
        found.append((Finding(
            "eval_mode", f"{plural(len(listed), 'module')} ran in eval mode in a step that "
            f"trains through {_them(listed)}: {names(listed)} ({_eval_effect(modules, evals)}).",
            type(modules[evals[0][0]]).__name__, at, evals[0][0] or None,
            "call model.train() before the training steps (and model.eval() only for "
            "evaluation)", sites=(Site("forward", type(modules[evals[0][0]]).__name__, at,
                                       evals[0][0] or None),)),
            ("eval_mode", tuple(listed))))
    return found


def _eval_effect(modules: dict[str, torch.nn.Module], evals: list[tuple[str, Any]]) -> str:
    kinds = {isinstance(modules[n], torch.nn.modules.dropout._DropoutNd) for n, _ in evals}
    said = [("dropout off" if dropout else "normalisation using running statistics")
            for dropout in sorted(kinds, reverse=True)]
    return ", ".join(said)


def _frozen_norm(module: torch.nn.Module) -> bool:
    own = list(module.parameters(recurse=False))
    return (not isinstance(module, torch.nn.modules.dropout._DropoutNd) and bool(own)
            and not any(p.requires_grad for p in own))


def _are(listed: list) -> str:
    return "is" if len(listed) == 1 else "are"


def _their(listed: list) -> str:
    return "its" if len(listed) == 1 else "their"


def _them(listed: list) -> str:
    """The pronoun for the listed parameters: "it" for one, "them" for more."""
    return "it" if len(listed) == 1 else "them"


@dataclass(frozen=True)
class Carried:
    """A parameter's ``.grad`` as a backward after a step left it or found it: the tensor
    (weakly: a gradient reset to None is not kept alive), its version, and the backward's
    line."""

    grad: weakref.ref[torch.Tensor]
    version: int | None  # None where this torch has no version counters
    line: str | None = None

    @classmethod
    def of(cls, grad: torch.Tensor, line: str | None = None) -> Carried:
        return cls(weakref.ref(grad), torchcompat.tensor_version(grad), line)

    def holds(self, grad: torch.Tensor | None) -> bool:
        """Whether ``grad`` is still that tensor (no ``zero_grad()`` set it to None)."""
        return grad is not None and self.grad() is grad


def _nonzero(grads: list[torch.Tensor]) -> list[bool]:
    if not grads:
        return []
    with torch.no_grad():
        return torch.stack([g.ne(0).any() for g in grads]).tolist()


def stale_grads(watched: Watched, optimizer: Any) -> dict[int, Carried]:
    """Before the first backward after ``optimizer``'s step: its parameters whose ``.grad`` is
    still non-zero (no ``zero_grad()`` since the step), by bit."""
    stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    held = [(b, p.grad) for b, p in enumerate(watched.params)
            if p.grad is not None and id(p) in stepped]
    flags = _nonzero([g for _, g in held])
    return {b: Carried.of(g) for (b, g), nonzero in zip(held, flags) if nonzero}


def added_to(watched: Watched, stale: dict[int, Carried], line: str | None
             ) -> dict[int, Carried]:
    """After that backward: the stale gradients it added to (the ``.grad`` replaced or
    modified in place), as it left them. A backward that reaches none of them (through
    ``fake.detach()``, frozen layers, ``inputs=``) adds to nothing."""
    out = {}
    for b, was in stale.items():
        grad = watched.params[b].grad
        if grad is not None and (not was.holds(grad)
                                 or torchcompat.tensor_version(grad) != was.version):
            out[b] = Carried.of(grad, line)
    return out


def still_carried(watched: Watched, carried: dict[int, Carried]) -> dict[int, Carried]:
    """Before a later backward: the carried gradients no ``zero_grad()`` has cleared since
    (set to None, or zeroed in place)."""
    kept = [(b, c) for b, c in carried.items() if c.holds(watched.params[b].grad)]
    flags = _nonzero([watched.params[b].grad for b, _ in kept])  # type: ignore[misc]
    return {b: c for (b, c), nonzero in zip(kept, flags) if nonzero}


def check_accumulate(watched: Watched, optimizer: Any, carried: dict[int, Carried]
                     ) -> list[Keyed]:
    """At ``optimizer.step()``: its parameters whose ``.grad`` still holds what a backward
    added to gradients left from before the last step (``carried``) step on the sum."""
    stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    hit = [(b, c) for b, c in carried.items() if id(watched.params[b]) in stepped
           and c.holds(watched.params[b].grad)]
    if not hit:
        return []
    stale = [watched.names[b] for b, _ in hit]
    line = hit[0][1].line
    return [(Finding(
            "grads_accumulate", f"This backward adds to gradients left from before the last "
            f"optimizer step ({plural(len(stale), 'parameter')}: {names(stale)}): no zero_grad() "
            "ran in between, so each step uses the sum of every step's gradients so far.",
            "backward", line, watched.param_site(hit[0][0]),
            "call optimizer.zero_grad() once per step, before backward (or after step())",
            param=stale[0], sites=(Site("backward", "backward", line),)),
        ("grads_accumulate",))]
