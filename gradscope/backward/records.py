"""What ``gs.record_backward`` saw, as plain data: per-node steps in engine order, gradient
statistics, and the first non-finite gradient. Filled by ``gradscope.backward.recorder``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..graph.graph import Graph


@dataclass(slots=True)
class GradStat:
    """Statistics of one gradient tensor.

    Attributes:
        shape: the gradient's shape.
        norm: its 2-norm (``torch.linalg.vector_norm``); NaN when any element is NaN.
        max_abs: the largest absolute value; NaN when any element is NaN.
        nan: some element is NaN.
        inf: some element is +Inf or -Inf.
    """

    shape: list[int]
    norm: float
    max_abs: float
    nan: bool
    inf: bool

    @property
    def finite(self) -> bool:
        """No element is NaN or Inf."""
        return not (self.nan or self.inf)

    @property
    def kind(self) -> str | None:
        """``nan``, ``inf`` (NaN wins when both occur) or None."""
        return "nan" if self.nan else "inf" if self.inf else None


@dataclass(slots=True)
class NodeStep:
    """One node the engine ran, in engine order.

    Attributes:
        node_id: the node's id in ``BackwardTrace.graph``.
        name: its class name (``MulBackward0``...).
        grad_outputs: the gradients the node received, one per forward output (None: none came).
        grad_inputs: the gradients it returned, one per ``next_functions`` slot (None: not needed).
            AccumulateGrad returns nothing: its gradient is its ``grad_outputs[0]``.
    """

    node_id: str
    name: str
    grad_outputs: list[GradStat | None]
    grad_inputs: list[GradStat | None]


@dataclass(slots=True)
class NonFinite:
    """The first gradient with a NaN or Inf, in engine order.

    Attributes:
        node_id: id of the node in ``BackwardTrace.graph``.
        name: its class name, as ``detect_anomaly`` names it (``SqrtBackward0``).
        slot: ``grad_inputs[i]`` when the node returned it (the usual case), ``grad_outputs[i]``
            when it arrived from outside the recorded graph (a ``grad_tensors`` argument, a tensor
            hook) or reached an AccumulateGrad.
        kind: ``nan`` or ``inf``.
        traceback: where the node was created: ``file:line: code`` when the forward ran under
            ``gs.record_forward()``, the forward stack when it ran under ``detect_anomaly``,
            else None.
        param: for AccumulateGrad, the name of the parameter that received the gradient.
    """

    node_id: str
    name: str
    slot: str
    kind: str
    traceback: str | None
    param: str | None = None


@dataclass(slots=True)
class ForwardNonFinite:
    """The first op of a forward whose output held a NaN or Inf
    (``gs.record_forward(check_finite=True)``).

    Attributes:
        op: the torch function that made it (``log``, ``__mul__``, ``linear``).
        node: the class name of the autograd node it made (``LogBackward0``), or None when
            the op ran without grad.
        kind: ``nan`` or ``inf`` (NaN wins when both occur).
        module: the module path whose forward ran it (with ``gs.scopes``), or None.
        where: the user's line, ``file:line: code``, or None.
        index: position of that value among the values checked (0 is the first).
        masked: the value never reached the outputs (``torch.where``, a mask, an integer
            path: Hugging Face T5's ``log`` of a 0 relative position) and every gradient was
            finite: said, but no finding (the CLI exits 0).
        input: when no op made it: the tensor the forward was given that already held it
            (``the input example_input``, ``the input build()[1]['pixel_values']``, ``the
            parameter fc.weight``, ``the buffer bn.running_mean``, ``a parameter``); ``op``,
            ``module`` and ``where`` then say which call computed from it first (reading its
            shape is no such call); ``op`` is ``""`` when none did. None when an op of the
            forward made it.
    """

    op: str
    node: str | None
    kind: str
    module: str | None
    where: str | None
    index: int = 0
    input: str | None = None
    masked: bool = False

    def summary(self) -> str:
        """One line: ``the forward already produced nan at LogBackward0 in mid (model.py:7)``,
        or, for a value that came in with the batch, ``the input example_input already held
        nan before the forward ran (first read by linear in fc1, model.py:7)``.

        Example:
            >>> bad = ForwardNonFinite("linear", None, "nan", "fc1", None, 0, "the input x")
            >>> bad.summary()  # doctest: +NORMALIZE_WHITESPACE
            'the input x already held nan before the forward ran (first read by linear in fc1)'
        """
        if self.module is None:
            inside = ""
        else:
            inside = f" in {self.module}" if self.module else " in the model's own forward"
        line = self.where.split(": ", 1)[0] if self.where else None
        if self.input is not None:
            at = f", {line}" if line else ""
            read = (f"first read by {self.op}{inside}{at}" if self.op
                    else "no op of the forward computed from it")
            return f"{self.input} already held {self.kind} before the forward ran ({read})"
        what = self.node or self.op
        at = f" ({line})" if line else ""
        hidden = (", masked later: the outputs and every gradient are finite"
                  if self.masked else "")
        return f"the forward already produced {self.kind} at {what}{inside}{at}{hidden}"


@dataclass
class BackwardTrace:
    """What ``record_backward`` saw; filled in when its block ends.

    Attributes:
        steps: one ``NodeStep`` per node run, in engine order (over every backward call in the
            block).
        first_nonfinite: the first NaN/Inf gradient, or None.
        forward_nonfinite: when the forward was recorded too (``gs.record_forward(
            check_finite=True)``, as ``gradscope render --backward`` does): the first value
            of the forward that held a NaN or Inf, or None. The backward's NaN/Inf then
            comes from it; it is a finding even when every gradient stayed finite.
        graph: the traced graph, annotated: ``Node.order`` (first run, 0 first), ``Edge.grad_norm``
            (norm of the gradient that flowed along the edge), and on nodes whose gradients were
            not finite ``Node.nonfinite`` (``nan``/``inf``), ``Node.first_nonfinite`` and
            ``Node.created_at`` where known.
    """

    steps: list[NodeStep] = field(default_factory=list)
    first_nonfinite: NonFinite | None = None
    graph: Graph = field(default_factory=Graph)
    forward_nonfinite: ForwardNonFinite | None = None

    @property
    def found(self) -> bool:
        """A NaN or Inf was found, in a gradient, or in the forward where it was not masked
        before the outputs (the CLI's exit code 1)."""
        fwd = self.forward_nonfinite
        return self.first_nonfinite is not None or (fwd is not None and not fwd.masked)

    def nonfinite_params(self) -> list[str]:
        """Names of the leaves whose AccumulateGrad received a NaN/Inf gradient, in graph order."""
        leaf_of = {e.src: e.dst for e in self.graph.edges if e.kind == "grad"}
        out = []
        for node in self.graph.nodes:
            if node.kind == "accumulate" and node.nonfinite:
                leaf = self.graph.node(leaf_of[node.id])
                out.append(leaf.name or leaf.id)
        return out

    def _slot_target(self, bad: NonFinite) -> str:
        """`` -> fc.bias`` when the bad slot flows into a parameter's AccumulateGrad."""
        m = re.fullmatch(r"grad_inputs\[(\d+)\]", bad.slot)
        if m is None:
            return ""
        k = int(m.group(1))
        dst = next((e.dst for e in self.graph.edges if e.src == bad.node_id and e.input_nr == k
                    and e.kind == "grad"), None)
        leaf = next((e.dst for e in self.graph.edges if e.src == dst and e.kind == "grad"), None)
        if dst is None or self.graph.node(dst).kind != "accumulate" or leaf is None:
            return ""
        return f" -> {self.graph.node(leaf).name or leaf}"

    def summary(self) -> str:
        """One line: nodes run, and the first non-finite gradient if any."""
        ran = len({s.node_id for s in self.steps})
        line = f"backward ran {len(self.steps)} node steps ({ran} distinct nodes)"
        bad = self.first_nonfinite
        if bad is None:
            return line + ", all gradients finite"
        where = f" in {bad.param}" if bad.param else self._slot_target(bad)
        line += (
            f"; first non-finite gradient: {bad.kind} from {bad.name} ({bad.node_id}) "
            f"{bad.slot}{where}"
        )
        if bad.traceback and "\n" not in bad.traceback:
            line += f", created at {bad.traceback}"
        return line


