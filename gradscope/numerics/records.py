"""What ``gs.record_numerics`` keeps of a run, and what ``gs.compare_runs`` finds, as plain data
(no torch, rich or numpy).

A ``NumericsRun`` is a list of ``OpRecord`` (every op of the forward and the backward that made
a floating-point tensor, in the order it ran), the ``LeafRecord`` of every tensor the ops read
that no recorded op made (the parameters, the model's inputs), and a ``ParamRecord`` per
parameter gradient. Each keeps a ``Stats``: dtype, shape, norm, max-abs, non-finite count and a
*sketch*, a fixed-seed linear projection of the tensor onto ``k`` numbers that is the same for
every run of every process (``gradscope.numerics.sketch``): two sketches estimate the relative
error between two runs' tensors without storing the tensors.

A ``Divergence`` is what ``compare_runs`` says: ``ok``, ``first`` (a ``DivergencePoint``: the
first op, input or gradient whose error its inputs do not explain), ``params`` (a ``ParamDiff``
per parameter) and ``path`` (the ops from the inputs to the first divergence and a few after).
A ``DivergenceGraph`` is a candidate's ``Graph`` with ``DivergenceMarks`` (each node's
``NodeError``): the graph page of a divergence (``gs.trace_divergence``).

Both are one JSON document in the project's envelope: ``{"gradscope": 1, "kind": "numerics",
...}`` for a run, ``{"gradscope": 1, "kind": "numerics_compare", ...}`` for a divergence;
NaN and Inf are the strings ``"nan"``, ``"inf"``, ``"-inf"``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SchemaError
from ..graph.graph import Graph
from ..output.envelope import dumps, envelope, float_from_json, json_float, open_document
from ..output.files import write_atomic
from ..output.formats import Shown

#: The phases of a record and of a divergence point.
PHASES = ("input", "forward", "backward", "param")
#: Significant digits kept of each figure in a saved run (a sketch's relative error is read
#: down to about 1e-7, so 9 digits keep it exact enough in float32 and float64 runs).
DIGITS = 9


def _f(x: float) -> float | str:
    return json_float(x, DIGITS)


@dataclass(frozen=True)
class Stats:
    """One tensor's statistics.

    Attributes:
        dtype: ``float32``, ``bfloat16``...
        shape: the full shape.
        norm: the L2 norm (NaN or Inf when the tensor holds a non-finite value).
        maxabs: the largest absolute value (NaN when the tensor holds a NaN).
        nonfinite: how many elements are NaN or Inf.
        sketch: the fixed-seed projection (``gradscope.numerics.sketch``), ``k`` numbers.
    """

    dtype: str
    shape: tuple[int, ...]
    norm: float
    maxabs: float
    nonfinite: int
    sketch: tuple[float, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "norm": _f(self.norm),
                "maxabs": _f(self.maxabs), "nonfinite": self.nonfinite,
                "sketch": [_f(v) for v in self.sketch]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stats:
        return cls(str(d["dtype"]), tuple(int(x) for x in d["shape"]), float_from_json(d["norm"]),
                   float_from_json(d["maxabs"]), int(d["nonfinite"]),
                   tuple(float_from_json(v) for v in d["sketch"]))


@dataclass(frozen=True)
class OpRecord:
    """One floating-point output of one op.

    Attributes:
        index: its place in the run (0, 1, ...).
        phase: ``forward`` (any op outside the autograd engine) or ``backward``.
        op: the aten op (``aten.mm``); ``aten.native_layer_norm#1`` for an op's second output.
        module: the module path it ran in (``encoder.layers.0.attn``), or None.
        line: ``file.py:NN`` of the user's line that ran it (a custom Function's backward
            included), or None (the engine runs built-in backward nodes).
        node: in the backward, the autograd node running it (``MmBackward0``), else None.
        stats: the output's ``Stats``.
        inputs: where each floating-point input came from: ``i >= 0`` the op record ``i``,
            ``-(j + 1)`` the leaf ``j``.
        flag: ``"cast"`` for a dtype conversion (compare skips casts only one run has), else
            None. Views, copies and ``detach`` are not recorded: the tensors they make stand
            for the tensor they came from.
        seq: that node's ``_sequence_nr()`` (unique in the process that recorded the run: the
            graph page finds the node with it, ``gs.trace_divergence``), or None. Files saved
            before it existed read as None.
    """

    index: int
    phase: str
    op: str
    module: str | None
    line: str | None
    node: str | None
    stats: Stats
    inputs: tuple[int, ...] = ()
    flag: str | None = None
    seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "op": self.op, "module": self.module, "line": self.line,
                "node": self.node, **self.stats.to_dict(), "inputs": list(self.inputs),
                "flag": self.flag, "seq": self.seq}

    @classmethod
    def from_dict(cls, index: int, d: dict[str, Any]) -> OpRecord:
        seq = d.get("seq")
        return cls(index, str(d["phase"]), str(d["op"]), d.get("module"), d.get("line"),
                   d.get("node"), Stats.from_dict(d), tuple(int(i) for i in d.get("inputs", ())),
                   d.get("flag"), None if seq is None else int(seq))


@dataclass(frozen=True)
class LeafRecord:
    """A tensor the recorded ops read that none of them made.

    Attributes:
        index: ``j`` (ops name it as the input ``-(j + 1)``).
        name: the parameter's name, ``input 0`` (the model's first tensor argument),
            ``<name>.grad``, or ``leaf 3`` (any other tensor made before the recording).
        position: the number of op records before its first use (its place in the run).
        stats: its ``Stats`` when first read.
    """

    index: int
    name: str
    position: int
    stats: Stats

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "position": self.position, **self.stats.to_dict()}

    @classmethod
    def from_dict(cls, index: int, d: dict[str, Any]) -> LeafRecord:
        return cls(index, str(d["name"]), int(d["position"]), Stats.from_dict(d))


@dataclass(frozen=True)
class ParamRecord:
    """A parameter's gradient when the recording ended (``None`` stats: no gradient).

    Attributes:
        name: the parameter's name in ``model.named_parameters()``.
        stats: its ``.grad``'s ``Stats`` (DTensor: of the full tensor), or None.
        producer: the op record that last wrote the gradient, or None (made outside the
            recording, or by a collective that no op record shows).
    """

    name: str
    stats: Stats | None
    producer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        stats = self.stats.to_dict() if self.stats is not None else {"grad": None}
        return {"name": self.name, "producer": self.producer, **stats}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParamRecord:
        stats = None if "sketch" not in d else Stats.from_dict(d)
        producer = d.get("producer")
        return cls(str(d["name"]), stats, None if producer is None else int(producer))


@dataclass
class NumericsRun:
    """One recorded run (``gs.record_numerics`` fills it when its block ends).

    Attributes:
        ops: every recorded op output, in the order the ops ran.
        leaves: the tensors the ops read that no recorded op made.
        params: each parameter's gradient (with ``model``), in ``named_parameters()`` order.
        model: the model's class name, or None.
        rank, world: this process's rank and the world size under ``torch.distributed``
            (0 and 1 without it).
        k, seed: the sketch's size and seed (two runs compare only when both are equal).
        torch: the torch version that ran it.
        notes: what could not be recorded (one line each).

    Example:
        >>> run = NumericsRun()
        >>> NumericsRun.from_json(run.to_json()) == run
        True
    """

    ops: list[OpRecord] = field(default_factory=list)
    leaves: list[LeafRecord] = field(default_factory=list)
    params: list[ParamRecord] = field(default_factory=list)
    model: str | None = None
    rank: int = 0
    world: int = 1
    k: int = 32
    seed: int = 0
    torch: str = ""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def phases(self) -> dict[str, int]:
        """How many op records each phase has."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.phase] = counts.get(op.phase, 0) + 1
        return counts

    def summary(self) -> str:
        """``412 ops, 3 leaves, 4 gradients of MLP`` (and ``, rank 1 of 2`` under
        ``torch.distributed``); ``phases`` has the ops by phase."""
        grads = sum(1 for p in self.params if p.stats is not None)
        model = f" of {self.model}" if self.model else ""
        where = f", rank {self.rank} of {self.world}" if self.world > 1 else ""
        return f"{len(self.ops)} ops, {len(self.leaves)} leaves, {grads} gradients{model}{where}"

    def to_dict(self) -> dict[str, Any]:
        return envelope("numerics", {
            "model": self.model, "rank": self.rank, "world": self.world, "k": self.k,
            "seed": self.seed, "torch": self.torch, "notes": list(self.notes),
            "ops": [o.to_dict() for o in self.ops],
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "params": [p.to_dict() for p in self.params],
        })

    def to_json(self) -> str:
        """The run as one JSON document (``{"gradscope": 1, "kind": "numerics", ...}``), one
        record per line."""
        data = self.to_dict()
        rows = {key: data.pop(key) for key in ("ops", "leaves", "params")}
        head = dumps(data, indent=None)[:-1]
        body = ",\n".join(
            f'"{key}": [' + ",\n".join(dumps(r, indent=None) for r in records) + "]"
            for key, records in rows.items()
        )
        return f"{head},\n{body}}}"

    @classmethod
    def from_json(cls, text: str) -> NumericsRun:
        """The inverse of ``to_json``.

        Raises:
            SchemaError: not a gradscope numerics document, or a malformed one.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SchemaError(f"not JSON: {exc}") from None
        doc = open_document(data, "numerics")
        try:
            return cls(
                ops=[OpRecord.from_dict(i, d) for i, d in enumerate(doc["ops"])],
                leaves=[LeafRecord.from_dict(i, d) for i, d in enumerate(doc["leaves"])],
                params=[ParamRecord.from_dict(d) for d in doc["params"]],
                model=doc.get("model"), rank=int(doc.get("rank", 0)),
                world=int(doc.get("world", 1)), k=int(doc["k"]), seed=int(doc["seed"]),
                torch=str(doc.get("torch", "")), notes=[str(n) for n in doc.get("notes", ())],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"a malformed numerics document ({type(exc).__name__}: {exc})"
                              ) from None

    def save(self, path: str | Path) -> Path:
        """Write the run to ``path`` as JSON, atomically; returns the path."""
        return write_atomic(Path(path), self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> NumericsRun:
        """A run saved by ``save`` (``SchemaError`` when the file is another document)."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class DivergencePoint:
    """One place in a run that ``compare_runs`` measured.

    Attributes:
        phase: ``input`` (a leaf), ``forward``, ``backward`` or ``param`` (a gradient).
        op: the aten op, or None (an input, a gradient).
        module: the module path, or None.
        line: ``file.py:NN`` of the candidate's line, or None.
        error: the relative error against the reference (estimated from the sketches; inf
            when only the candidate is non-finite).
        expected: the error its inputs and the dtypes explain.
        amplification: ``error / expected``.
        index: the candidate's op record (leaf, for ``input``), or -1 for a gradient.
        name: a leaf's or a parameter's name, else None.
        dtype: the candidate's dtype.
        shape: the shape.
        nonfinite: how many non-finite values the candidate's tensor has.
        ref_nonfinite: how many the reference's has.
        diverged: its error is beyond the tolerance (``first`` is the first such point).
        node: an op's autograd node in the candidate (``OpRecord.node``), or None.
        seq: that node's sequence number (``OpRecord.seq``): where ``gs.trace_divergence``
            draws it.
    """

    phase: str
    op: str | None
    module: str | None
    line: str | None
    error: float
    expected: float
    amplification: float
    index: int = -1
    name: str | None = None
    dtype: str = ""
    shape: tuple[int, ...] = ()
    nonfinite: int = 0
    ref_nonfinite: int = 0
    diverged: bool = False
    node: str | None = None
    seq: int | None = None

    def measured(self) -> str:
        """``relative error 0.31, 45x the 0.0069 its inputs and dtype explain``, or what the
        non-finite values say when only one side has them."""
        if math.isinf(self.error) and self.nonfinite != self.ref_nonfinite:
            return (f"{self.nonfinite} non-finite values where the reference has "
                    f"{self.ref_nonfinite or 'none'} (its inputs and dtype explain a relative "
                    f"error of {_format(self.expected)})")
        return (f"relative error {_format(self.error)}, {_format(self.amplification)}x the "
                f"{_format(self.expected)} its inputs and dtype explain")

    def where(self) -> str:
        """``aten.exp at softmax.py:12 (attn)``: what and where."""
        what = self.op or self.name or self.phase
        text = f"{what} ({self.phase})" if self.op else f"{self.phase} {what}"
        if self.line:
            text += f" at {self.line}"
        if self.module:
            text += f" in {self.module}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "op": self.op, "module": self.module, "line": self.line,
                "error": json_float(self.error, 4), "expected": json_float(self.expected, 4),
                "amplification": json_float(self.amplification, 4), "index": self.index,
                "name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "nonfinite": self.nonfinite, "ref_nonfinite": self.ref_nonfinite}


@dataclass(frozen=True)
class ParamDiff:
    """A parameter's gradient in the candidate against the reference.

    Attributes:
        name: the parameter's name.
        rel_error: ``|g_c - g_r| / |g_r|`` (from the sketches; inf where only one has a
            gradient).
        ratio: ``|g_c| / |g_r|`` (2.0 for a doubled gradient; NaN where either has none).
        ok: within tolerance: its producer's error and the dtypes explain it, and no op that
            made it diverged.
        expected: the error its producer's error and the dtypes explain.
        after_divergence: out of tolerance because an op it comes from diverged (its own
            step may be right).
    """

    name: str
    rel_error: float
    ratio: float
    ok: bool
    expected: float = 0.0
    after_divergence: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rel_error": json_float(self.rel_error, 4),
                "ratio": json_float(self.ratio, 6), "ok": self.ok,
                "expected": json_float(self.expected, 4),
                "after_divergence": self.after_divergence}


def _format(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


@dataclass(frozen=True)
class Divergence(Shown):
    """Where the candidate run leaves the reference (``gs.compare_runs``).

    Attributes:
        ok: nothing beyond what the dtypes explain (no ``first``).
        first: the first point (in the candidate's order: inputs, ops, then gradients) whose
            error its inputs' error and the dtypes do not explain, or None.
        params: every parameter's gradient compared (``ParamDiff``), in the reference's order.
        path: the points from the inputs to ``first`` and a few after (the rich table's rows);
            the worst few points when the runs agree.
        compared: how many op records were matched and compared.
        noise: how many matched op records were not judged: the reference's output is
            rounding noise there (its inputs cancel to about zero).
        threshold: the amplification above which a point diverges.
        rtol: the tolerance given to ``compare_runs``, or None.
        notes: what was not compared and why (one line each).
        points: every point measured (inputs, ops, then gradients, in the candidate's order):
            what the graph page colours (``gs.trace_divergence``).

    ``render()`` is the rich table ``gradscope compare`` prints (the view
    ``gradscope.numerics.views``); ``print(d)`` shows its text.
    """

    VIEW = "numerics"

    ok: bool
    first: DivergencePoint | None
    params: tuple[ParamDiff, ...] = ()
    path: tuple[DivergencePoint, ...] = ()
    compared: int = 0
    noise: int = 0
    threshold: float = 0.0
    rtol: float | None = None
    notes: tuple[str, ...] = ()
    points: tuple[DivergencePoint, ...] = field(default=(), repr=False)

    @property
    def bad_params(self) -> tuple[ParamDiff, ...]:
        """The parameters whose gradient is out of tolerance."""
        return tuple(p for p in self.params if not p.ok)

    def summary(self) -> str:
        """One paragraph: the verdict, the first divergence, the gradients out of tolerance."""
        n = len(self.params)
        if self.ok:
            text = (f"The runs agree: {self.compared} ops and {n} gradients compared, no error "
                    f"beyond {self.threshold:g}x what the inputs and dtypes explain.")
        else:
            f = self.first
            assert f is not None
            if f.phase == "input":
                text = (f"The inputs differ: {f.name} has relative error {_format(f.error)} "
                        f"({_format(f.amplification)}x its dtype's rounding); the ops after it "
                        "are not blamed for it.")
            elif f.phase == "param":
                text = f"The gradient of {f.name} diverges: {f.measured()}."
            else:
                text = f"First divergence: {f.where()}: {f.measured()}."
            bad = self.bad_params
            if bad:
                shown = ", ".join(f"{p.name} (ratio {_format(p.ratio)}, error "
                                  f"{_format(p.rel_error)})" for p in bad[:4])
                more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
                text += f" Gradients out of tolerance: {shown}{more}."
            text += f" ({self.compared} ops and {n} gradients compared.)"
        for note in self.notes:
            text += f" Note: {note}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return envelope("numerics_compare", {
            "ok": self.ok, "first": self.first.to_dict() if self.first else None,
            "summary": self.summary(), "compared": self.compared, "noise": self.noise,
            "threshold": self.threshold, "rtol": self.rtol,
            "params": [p.to_dict() for p in self.params],
            "path": [p.to_dict() for p in self.path], "notes": list(self.notes),
        })

    def to_json(self) -> str:
        """``{"gradscope": 1, "kind": "numerics_compare", ...}`` as JSON text."""
        return dumps(self.to_dict())

    def write_json(self, path: str | Path) -> Path:
        """Write ``to_json()`` to ``path`` atomically; returns the path."""
        return write_atomic(Path(path), self.to_json() + "\n")


@dataclass(frozen=True)
class NodeError:
    """What the graph page says of one node: the points of a ``Divergence`` drawn by it (the
    ops its forward output and its backward ran, a parameter's gradient, a leaf's values).

    Attributes:
        error: the largest relative error of those points against the reference.
        amplification: the largest amplification (error over what inputs and dtype explain).
        what: the point with the largest error, said as ``DivergencePoint.where`` says it.
        line: that point's line, or None.
        count: how many points the node draws.
        diverged: one of them is beyond the tolerance.
    """

    error: float
    amplification: float
    what: str
    line: str | None = None
    count: int = 1
    diverged: bool = False


@dataclass(frozen=True)
class DivergenceMarks:
    """What the graph page colours (``to_html(graph, numerics=marks)``): node id ->
    ``NodeError``, the node of the first divergence, and the comparison's verdict.

    Attributes:
        nodes: node id -> its ``NodeError`` (nodes no point maps to are not here).
        first: the node id of ``Divergence.first``, or None (the runs agree, or no node of the
            graph stands for it: an input that needs no gradient, an op that made none).
        summary: ``Divergence.summary()``.
        ok: ``Divergence.ok``.
        threshold: the amplification above which a point diverges.
        unmapped: how many of the ops measured have no node in the graph.
        measured: how many ops were measured.
    """

    nodes: dict[str, NodeError]
    first: str | None
    summary: str
    ok: bool
    threshold: float = 0.0
    unmapped: int = 0
    measured: int = 0


@dataclass(frozen=True)
class DivergenceGraph:
    """The candidate's autograd graph with a ``Divergence`` drawn on it
    (``gs.trace_divergence``): ``to_html()`` / ``save(path)`` give the graph page, each node
    coloured by its error against the reference, the first divergence marked and shown first.

    Attributes:
        graph: the candidate's ``Graph``.
        marks: what the page draws on it (``DivergenceMarks``).
    """

    graph: Graph
    marks: DivergenceMarks

    def to_html(self, **options: Any) -> str:
        """The page (``gradscope.render.html.to_html``'s options: ``title``, ``depth``...)."""
        from ..output.formats import renderer

        return str(renderer("numerics_html")(self.graph, numerics=self.marks, **options))

    def save(self, path: str | Path, **options: Any) -> Path:
        """Write the page to ``path`` atomically; returns the path."""
        return write_atomic(Path(path), self.to_html(**options))
