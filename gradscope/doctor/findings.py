"""The autograd doctor's findings, as plain data (no torch).

``gs.doctor(model, optimizer=...)`` (``gradscope.doctor.core``) watches a forward and backward
and fills one ``Finding`` per thing that went wrong: an autograd error it explains (``inplace``,
``backward_twice``, ``no_grad_fn``; ``inplace_forward``, an in-place op torch refused in the
forward), a parameter left without a gradient (``grad_none``, with a
``reason``), or a training-loop slip (``not_in_optimizer``, ``frozen_in_optimizer``,
``grads_accumulate``, ``eval_mode``). Each finding names the op, the user's line
(``"file.py:NN"``), the module path and a concrete fix; ``sites`` lists every place involved
(the op that saved a tensor and the one that modified it, say), first the one ``line`` names.

``torch_error_kind`` tells which of torch's own autograd errors a message is, so that the CLI
can point at ``gradscope doctor`` when a command ends in one.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..output.envelope import dumps, envelope, open_document
from ..output.files import write_atomic
from ..output.formats import Shown

#: every kind of finding, in the order a report lists them
KINDS = (
    "inplace", "inplace_forward", "backward_twice", "no_grad_fn", "grad_none",
    "not_in_optimizer",
    "frozen_in_optimizer", "grads_accumulate", "eval_mode",
)
#: why a parameter has no gradient (``Finding.reason`` of ``grad_none``)
GRAD_NONE_REASONS = ("unused", "no_grad", "cut", "frozen_upstream", "compiled")
#: which in-place op torch refused in the forward (``Finding.reason`` of ``inplace_forward``),
#: by the words of torch's message
FORWARD_ERRORS = (
    ("leaf_view", "a view of a leaf Variable that requires grad is being used in an in-place"),
    ("leaf", "a leaf Variable that requires grad is being used in an in-place"),
    ("leaf", "a leaf Variable that requires grad has been used in an in-place"),
    ("multi_view", "This view is the output of a function that returns multiple views"),
    ("custom_view", "This view was created inside a custom Function"),
    ("no_grad_view", "A view was created in no_grad mode and is being modified inplace"),
    ("inference", "Inplace update to inference tensor outside InferenceMode"),
)

#: torch's messages, by the kind of finding that explains them
_TORCH_ERRORS = (
    ("inplace", "has been modified by an inplace operation"),
    ("backward_twice", "Trying to backward through the graph a second time"),
    ("backward_twice", "access saved tensors after they have already been freed"),
    ("no_grad_fn", "does not require grad and does not have a grad_fn"),
    *(("inplace_forward", text) for _, text in FORWARD_ERRORS),
)


def forward_error_reason(message: str) -> str | None:
    """Which in-place op torch refused in the forward (a ``FORWARD_ERRORS`` reason: ``leaf``,
    ``leaf_view``, ``multi_view``, ``custom_view``, ``no_grad_view``, ``inference``), or None.

    Example:
        >>> forward_error_reason("a leaf Variable that requires grad is being used in an "
        ...                      "in-place operation.")
        'leaf'
    """
    for reason, text in FORWARD_ERRORS:
        if text in message:
            return reason
    return None


def torch_error_kind(message: str) -> str | None:
    """The finding kind that explains torch's error ``message`` (``inplace``, ``backward_twice``,
    ``no_grad_fn``, ``inplace_forward``), or None for any other error.

    Example:
        >>> torch_error_kind("element 0 of tensors does not require grad and does not have "
        ...                  "a grad_fn")
        'no_grad_fn'
        >>> torch_error_kind("mat1 and mat2 shapes cannot be multiplied") is None
        True
    """
    for kind, text in _TORCH_ERRORS:
        if text in message:
            return kind
    return None


_INPLACE = re.compile(
    r"\[(?P<type>[\w.]+) \[(?P<shape>[\d, ]*)\]\](?:, which is output (?P<nr>\d+) of "
    r"(?P<node>\w+),| is)? ?(?:is )?at version (?P<found>\d+); expected version "
    r"(?P<expected>\d+) instead"
)


@dataclass(frozen=True)
class InplaceMessage:
    """What torch's in-place error says: the tensor's type and shape, which output of which
    node it is (None for a leaf), and the versions found and expected."""

    tensor_type: str
    shape: tuple[int, ...]
    output_nr: int | None
    node: str | None
    found: int
    expected: int


def parse_inplace(message: str) -> InplaceMessage | None:
    """Read torch's "modified by an inplace operation" message (None if it is not one).

    Example:
        >>> m = parse_inplace("one of the variables needed for gradient computation has been "
        ...     "modified by an inplace operation: [torch.FloatTensor [16, 8]], which is output "
        ...     "0 of SigmoidBackward0, is at version 1; expected version 0 instead.")
        >>> m.shape, m.node, m.found, m.expected
        ((16, 8), 'SigmoidBackward0', 1, 0)
    """
    hit = _INPLACE.search(message)
    if hit is None:
        return None
    shape = tuple(int(d) for d in hit["shape"].replace(" ", "").split(",") if d)
    nr = hit["nr"]
    return InplaceMessage(hit["type"], shape, int(nr) if nr is not None else None,
                          hit["node"], int(hit["found"]), int(hit["expected"]))


@dataclass(frozen=True)
class Site:
    """One place in the user's program a finding involves: its ``role`` (``modified``,
    ``saved``, ``made``, ``cut``, ``no_grad``, ``backward``, ``step``...), the op, the line
    (``"file.py:NN"``), the module path (None outside the model) and, when the doctor traced
    the graph (``Doctor.trace``), the id of the graph node that stands for it there (the node
    that saved the tensor, the node the in-place op made), else None."""

    role: str
    op: str | None
    line: str | None
    module: str | None = None
    node: str | None = None

    def describe(self) -> str:
        """``saved by sigmoid at model.py:12 (encoder)``."""
        text = f"{self.role}"
        if self.op:
            text += f" by {self.op}"
        if self.line:
            text += f" at {self.line}"
        if self.module:
            text += f" ({self.module})"
        return text


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found.

    Attributes:
        kind: one of ``KINDS``.
        message: one paragraph saying what happened, naming the tensor or parameter.
        op: the op at fault (the in-place op, the cut, the op under no_grad...), or None.
        line: ``"file.py:NN"`` of that op in the user's code, or None when no line is known.
        module: the module path the op ran in (``encoder.layers.0``), or None.
        fix: what to change, concretely.
        reason: for ``grad_none``, one of ``GRAD_NONE_REASONS``; for ``inplace_forward``, one
            of the ``FORWARD_ERRORS`` reasons; else None.
        param: the parameter's name (``grad_none``, and the first of those named otherwise).
        sites: every place involved, the one ``line`` names first.
        torch_error: the first line of torch's error this finding explains, or None.
    """

    kind: str
    message: str
    op: str | None
    line: str | None
    module: str | None
    fix: str
    reason: str | None = None
    param: str | None = None
    sites: tuple[Site, ...] = field(default_factory=tuple)
    torch_error: str | None = None

    @property
    def nodes(self) -> tuple[tuple[str, str], ...]:
        """``(role, node id)`` of each site with a graph node (``Site.node``), in order."""
        return tuple((s.role, s.node) for s in self.sites if s.node is not None)

    @property
    def lines(self) -> tuple[str, ...]:
        """The line of every site, in order, each once (the sample tests compare these with
        the lines marked in the source)."""
        seen: list[str] = []
        for site in self.sites:
            if site.line is not None and site.line not in seen:
                seen.append(site.line)
        if self.line is not None and self.line not in seen:
            seen.insert(0, self.line)
        return tuple(seen)

    def title(self) -> str:
        """``inplace at model.py:14`` (``grad_none (cut)``...): the kind, and where."""
        kind = f"{self.kind} ({self.reason})" if self.reason else self.kind
        return f"{kind} at {self.line}" if self.line else kind

    def __str__(self) -> str:
        return f"{self.title()}: {self.message} Fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sites"] = [asdict(s) for s in self.sites]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        values = dict(data)
        values["sites"] = tuple(Site(**s) for s in values.get("sites", ()))
        return cls(**values)


def findings_json(findings: list[Finding] | tuple[Finding, ...]) -> str:
    """``{"gradscope": 2, "kind": "doctor", "findings": [...]}`` as JSON text."""
    return dumps(envelope("doctor", {"findings": [f.to_dict() for f in findings]}))


def findings_from_json(text: str) -> list[Finding]:
    """The inverse of ``findings_json`` (documents written before the envelope too)."""
    return [Finding.from_dict(f) for f in open_document(json.loads(text), "doctor")["findings"]]


def describe_tensor(tensor_type: str, shape: tuple[int, ...], output_nr: int | None,
                    node: str | None) -> str:
    """``the [16, 8] torch.FloatTensor (output 0 of SigmoidBackward0)``."""
    dims = ", ".join(str(d) for d in shape)
    made = f" (output {output_nr} of {node})" if node is not None else " (a leaf tensor)"
    return f"the [{dims}] {tensor_type}{made}"


def names(items: list[str], most: int = 4) -> str:
    """``a, b, c and 2 more``."""
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


#: What a finding's site is, said on its graph node (``Site.role``; another: "<role> here").
DOCTOR_ROLES = {
    "modified": "modified in place here", "saved": "saved the tensor here",
    "made": "made the carried tensor here", "used": "used the carried tensor here",
}


@dataclass(frozen=True)
class DoctorReport(Shown):
    """What one ``gs.doctor`` block found: its findings (none for a healthy step), how many
    backward calls and optimizer steps it watched, and ``notes`` (why it stopped watching, if
    it did)."""

    VIEW = "doctor"

    findings: tuple[Finding, ...]
    backwards: int = 0
    steps: int = 0
    notes: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.findings

    def verdict(self) -> str:
        """``3 findings (1 inplace, 2 grad_none) in 1 backward, 1 optimizer step``, or
        ``healthy: no findings (...)``."""
        watched = (f"{self.backwards} backward{'s' if self.backwards != 1 else ''}, "
                   f"{self.steps} optimizer step{'s' if self.steps != 1 else ''}")
        if self.healthy:
            return f"healthy: no findings ({watched})"
        kinds: dict[str, int] = {}
        for f in self.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        n = len(self.findings)
        return f"{n} finding{'s' if n != 1 else ''} ({parts}) in {watched}"

    def node_notes(self) -> dict[str, str]:
        """Graph node id -> what the findings say of that node (``modified in place here:
        zero_ at f.py:28 (inplace)``), for each site with a node (``Doctor.trace``); a node in
        several findings gets each, joined by "; ". The page and the SVG of ``render --doctor``
        label the nodes with it."""
        said: dict[str, list[str]] = {}
        for f in self.findings:
            for site in f.sites:
                if site.node is None:
                    continue
                where = " at ".join(w for w in (site.op, site.line) if w)
                text = (f"{DOCTOR_ROLES.get(site.role, site.role + ' here')}"
                        f"{': ' + where if where else ''} ({f.kind})")
                if text not in said.setdefault(site.node, []):
                    said[site.node].append(text)
        return {nid: "; ".join(texts) for nid, texts in said.items()}

    def to_json(self) -> str:
        return findings_json(self.findings)

    def write_json(self, path: Any) -> None:
        """Write ``to_json()`` to ``path`` atomically (the old file is kept if it fails)."""
        write_atomic(path, self.to_json() + "\n")

