"""``gs.compare_runs``: where a candidate run leaves a reference run (plain data: no torch).

**Matching.** The candidate's op records are matched to the reference's by ``(phase, module,
op, shape, flag)`` and their order among the records with that key; when fewer than half the
candidate's ops match that way (a compiled model, whose ops run outside its modules' hooks), by
``(phase, op, shape, flag)`` and order. A ``cast`` only the candidate has is compared with the
reference's tensor it converts (its source's match). Leaves are matched by name, unnamed ones
by order and shape. Runs of different world sizes (a data-parallel rank against one process)
compare only their gradients: each rank's ops see a part of the batch.

**Errors.** A matched op's relative error is ``|S c - S r| / |S r|`` from the two sketches
(inf when only one side has non-finite values). Its *expected* error is what its inputs and
the dtypes explain::

    expected = CONDITIONING * max(error of each input) + ROUNDING * u
               + ROUNDING * u_ref * cancellation

where ``u`` is the larger unit roundoff of the two runs' output dtypes (2^-8 bfloat16, 2^-11
float16, 2^-24 float32, 2^-53 float64), ``u_ref`` the reference's, an input's error is that
of the op that made it (a leaf's own error, for parameters and inputs), and *cancellation* is
how far below its inputs' scale the output is (the largest input root-mean-square over the
output's, at least 1): the reference's own rounding, amplified by a cancellation, is noise in
both runs; the candidate's is not excused (that is where a coarser dtype loses precision).
The *amplification* is ``error / expected``; a point diverges when its amplification exceeds
``THRESHOLD`` (with ``rtol``: when its error exceeds ``max(rtol, THRESHOLD * CONDITIONING *
input error)``). ``first`` is the first point
that diverges, in the candidate's order: a leaf (``input``: the runs were given different
values, which no op is blamed for), an op, then the gradients (``param``), each measured
against the error of the op that made it.

An op whose reference output is rounding noise (``ROUNDING * u_ref * cancellation >= NOISE``:
a gradient that cancels to about zero, say through a final layer norm) holds no digit to
compare and is not judged; the ops after it are given the error it has (noise as well).

An op whose match drifted (a compiled backward that runs the same ops in another order) is
tried, before it is called a divergence, against the reference's ops of the same kind and
shape nearby (``REORDER`` places either way in that kind's order); the closest counts.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import SchemaError
from .records import (
    Divergence,
    DivergencePoint,
    LeafRecord,
    NumericsRun,
    OpRecord,
    ParamDiff,
    Stats,
)

#: How much an op may amplify its inputs' relative error and still be normal.
CONDITIONING = 2.0
#: How many unit roundoffs of the dtype an op may add.
ROUNDING = 4.0
#: The amplification (error / expected) above which a point diverges.
THRESHOLD = 32.0
#: How far (in that op's order) a drifted match is looked for.
REORDER = 8
#: For a gradient whose producer was not compared (runs of different world sizes): how many
#: unit roundoffs a whole backward may add.
CHAIN = 64.0
#: An op whose reference output is this uncertain (its dtype's rounding amplified by the
#: cancellation) holds no digit to compare: it is not judged.
NOISE = 0.5
#: Points shown after the first divergence in ``Divergence.path``.
AFTER = 3
#: Points shown before it (the path back to the inputs).
BEFORE = 12

#: The unit roundoff of each dtype (half the distance from 1.0 to the next number).
UNIT = {
    "float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4, "float8_e4m3fnuz": 2.0**-4, "float8_e5m2": 2.0**-3,
    "float8_e5m2fnuz": 2.0**-3,
}


def unit(dtype: str) -> float:
    """The unit roundoff of ``dtype`` (float32's for an unknown one)."""
    return UNIT.get(dtype, UNIT["float32"])


def rel_error(ref: Stats, cand: Stats) -> float:
    """The relative error of ``cand`` against ``ref`` estimated from their sketches; inf when
    the two do not have the same number of non-finite values, 0 when both have some (their
    finite parts are not compared)."""
    if ref.nonfinite != cand.nonfinite:
        return math.inf
    if ref.nonfinite:
        return 0.0
    den = math.sqrt(sum(r * r for r in ref.sketch))
    num = math.sqrt(sum((c - r) ** 2 for c, r in zip(cand.sketch, ref.sketch, strict=True)))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _ratio(ref: Stats, cand: Stats) -> float:
    if ref.norm == 0.0:
        return 1.0 if cand.norm == 0.0 else math.inf
    return cand.norm / ref.norm


def _check(reference: NumericsRun, candidate: NumericsRun) -> None:
    if (reference.k, reference.seed) != (candidate.k, candidate.seed):
        raise SchemaError(
            f"the runs were sketched differently (k={reference.k}, seed={reference.seed} vs "
            f"k={candidate.k}, seed={candidate.seed}); record both with this gradscope"
        )
    ref = {p.name: p for p in reference.params}
    cand = {p.name: p for p in candidate.params}
    if set(ref) != set(cand):
        only_r = sorted(set(ref) - set(cand))
        only_c = sorted(set(cand) - set(ref))
        what = "; ".join(s for s in (
            f"only the reference has {', '.join(only_r[:3])}" if only_r else "",
            f"only the candidate has {', '.join(only_c[:3])}" if only_c else "") if s)
        raise SchemaError(f"the runs are of different models ({what})")
    for name, p in ref.items():
        q = cand[name]
        if p.stats is not None and q.stats is not None and p.stats.shape != q.stats.shape:
            raise SchemaError(
                f"the runs are of different models: {name} has shape {list(p.stats.shape)} in "
                f"the reference and {list(q.stats.shape)} in the candidate"
            )


def _keyed(ops: list[OpRecord], with_module: bool) -> dict[tuple[object, ...], list[int]]:
    groups: dict[tuple[object, ...], list[int]] = {}
    for op in ops:
        key = (op.phase, op.module if with_module else None, op.op, op.stats.shape, op.flag)
        groups.setdefault(key, []).append(op.index)
    return groups


def _match(ref: list[OpRecord], cand: list[OpRecord], with_module: bool) -> dict[int, int]:
    """candidate op index -> reference op index."""
    r, c = _keyed(ref, with_module), _keyed(cand, with_module)
    out: dict[int, int] = {}
    for key, cs in c.items():
        for a, b in zip(cs, r.get(key, ()), strict=False):
            out[a] = b
    return out


class _Comparison:
    def __init__(self, reference: NumericsRun, candidate: NumericsRun, rtol: float | None
                 ) -> None:
        self.ref = reference
        self.cand = candidate
        self.rtol = rtol
        self.notes: list[str] = []
        self.op_err: dict[int, float] = {}  # candidate op -> its error (compared ops only)
        self.op_ref: dict[int, Stats] = {}  # candidate op -> the reference values it stands for
        self.tainted: set[int] = set()  # candidate ops (and -(leaf + 1)) after a divergence
        self.carried: dict[int, float] = {}  # candidate op not compared -> its inputs' error
        self.leaf_err: dict[int, float] = {}
        self.noise = 0  # ops not judged: the reference's output is rounding noise
        self.points: dict[tuple[str, int], DivergencePoint] = {}
        self.first: DivergencePoint | None = None

    # ------------------------------------------------------------------ helpers
    def input_error(self, sources: tuple[int, ...]) -> float:
        worst = 0.0
        for s in sources:
            if s >= 0:  # an op; one not compared carries what its own inputs carried
                e = self.op_err.get(s, self.carried.get(s))
            else:
                e = self.leaf_err.get(-s - 1)
            if e is not None and e > worst:
                worst = e
        return worst

    def cancellation(self, c: OpRecord) -> float:
        """How far below its inputs' scale the op's output is: the largest root-mean-square
        of its inputs over the output's (at least 1); inf for an output of zeros, 1 for one
        with non-finite values."""
        if not math.isfinite(c.stats.norm):
            return 1.0  # non-finite values are not a cancellation
        out = _rms(c.stats)
        scale = 0.0
        for s in c.inputs:
            st = self.cand.ops[s].stats if s >= 0 else self.cand.leaves[-s - 1].stats
            scale = max(scale, _rms(st))
        if out == 0.0:
            return math.inf if scale > 0 else 1.0
        return max(1.0, scale / out)

    def tolerance(self, expected: float, e_in: float) -> float:
        if self.rtol is None:
            return THRESHOLD * expected
        return max(self.rtol, THRESHOLD * CONDITIONING * e_in)

    def judge(self, key: tuple[str, int], point: DivergencePoint, tol: float) -> bool:
        """Keep ``point`` under ``key``, marked ``diverged`` when its error is beyond ``tol``
        (the first such point is ``first``); whether it diverged."""
        bad = point.error > tol
        if bad:
            point = replace(point, diverged=True)
            if self.first is None:
                self.first = point
        self.points[key] = point
        return bad

    # ------------------------------------------------------------------ the walk
    def leaves(self) -> dict[int, tuple[int, DivergencePoint]]:
        """Each candidate leaf compared: leaf -> (position, point)."""
        queues: dict[str, list[LeafRecord]] = {}
        for leaf in reversed(self.ref.leaves):
            queues.setdefault(leaf.name, []).append(leaf)
        out: dict[int, tuple[int, DivergencePoint]] = {}
        for leaf in self.cand.leaves:
            queue = queues.get(leaf.name)
            other = queue.pop() if queue else None
            if other is None or other.stats.shape != leaf.stats.shape:
                continue
            err = rel_error(other.stats, leaf.stats)
            u = max(unit(other.stats.dtype), unit(leaf.stats.dtype))
            expected = ROUNDING * u
            self.leaf_err[leaf.index] = err
            out[leaf.index] = (leaf.position, DivergencePoint(
                "input", None, None, None, err, expected, _amplification(err, expected),
                leaf.index, leaf.name, leaf.stats.dtype, leaf.stats.shape,
                leaf.stats.nonfinite, other.stats.nonfinite))
        return out

    def ops(self, leaves: dict[int, tuple[int, DivergencePoint]]) -> int:
        ref, cand = self.ref.ops, self.cand.ops
        match = _match(ref, cand, True)
        countable = [op for op in cand if op.flag is None]
        if countable and len([o for o in countable if o.index in match]) < len(countable) / 2:
            loose = _match(ref, cand, False)
            if len(loose) > len(match):
                match = loose
                self.notes.append("ops matched without their module paths (a compiled model "
                                  "runs its ops outside the modules' hooks)")
        groups = _keyed(ref, False)
        place = {i: n for g in groups.values() for n, i in enumerate(g)}
        at_position: dict[int, list[DivergencePoint]] = {}
        for pos, point in leaves.values():
            at_position.setdefault(pos, []).append(point)
        compared = 0
        for c in cand:
            for point in at_position.pop(c.index, ()):
                if self.judge(("input", point.index), point,
                              self.tolerance(point.expected, 0.0)):
                    self.tainted.add(-point.index - 1)
            if any(s in self.tainted for s in c.inputs):
                self.tainted.add(c.index)
            r_index = match.get(c.index)
            if r_index is not None:
                r_stats: Stats | None = ref[r_index].stats
            elif c.flag == "cast" and len(c.inputs) == 1 and c.inputs[0] >= 0:
                r_stats = self.op_ref.get(c.inputs[0])  # the value it converts
                if r_stats is not None and r_stats.shape != c.stats.shape:
                    r_stats = None
            else:
                r_stats = None
            if r_stats is None:
                self.carried[c.index] = self.input_error(c.inputs)
                continue
            e_in = self.input_error(c.inputs)
            u = max(unit(r_stats.dtype), unit(c.stats.dtype))
            cond = self.cancellation(c)
            if ROUNDING * unit(r_stats.dtype) * cond >= NOISE:  # the reference's is noise
                self.carried[c.index] = max(e_in, rel_error(r_stats, c.stats))
                self.noise += 1
                continue
            expected = (CONDITIONING * e_in + ROUNDING * u
                        + ROUNDING * unit(r_stats.dtype) * cond)
            err = rel_error(r_stats, c.stats)
            tol = self.tolerance(expected, e_in)
            if err > tol and r_index is not None:  # a drifted match? the closest nearby
                group = groups[(ref[r_index].phase, None, ref[r_index].op,
                                ref[r_index].stats.shape, ref[r_index].flag)]
                n = place[r_index]
                for other in group[max(0, n - REORDER): n + REORDER + 1]:
                    e = rel_error(ref[other].stats, c.stats)
                    if e < err:
                        err, r_stats = e, ref[other].stats
            compared += 1
            self.op_err[c.index] = err
            self.op_ref[c.index] = r_stats
            point = DivergencePoint(c.phase, c.op, c.module, c.line, err, expected,
                                    _amplification(err, expected), c.index, None,
                                    c.stats.dtype, c.stats.shape, c.stats.nonfinite,
                                    r_stats.nonfinite, node=c.node, seq=c.seq)
            if self.judge(("op", c.index), point, tol):
                self.tainted.add(c.index)
        if self.noise:
            self.notes.append(
                f"{self.noise} op{'s' if self.noise != 1 else ''} not judged: the reference's "
                "output is rounding noise there (its inputs cancel to about zero)")
        for points in at_position.values():  # leaves read after the last op
            for point in points:
                self.judge(("input", point.index), point, self.tolerance(point.expected, 0.0))
        return compared

    def params(self, ops_compared: bool) -> list[ParamDiff]:
        cand = {p.name: p for p in self.cand.params}
        out: list[ParamDiff] = []
        for p in self.ref.params:
            q = cand[p.name]
            if p.stats is None and q.stats is None:
                continue
            if p.stats is None or q.stats is None:
                out.append(ParamDiff(p.name, math.inf, math.nan, False))
                point = DivergencePoint("param", None, _owner(p.name), None, math.inf, 0.0,
                                        math.inf, -1, p.name)
                self.judge(("param", len(out)), point, 0.0)
                continue
            err = rel_error(p.stats, q.stats)
            u = max(unit(p.stats.dtype), unit(q.stats.dtype))
            e_prod = None
            if ops_compared and q.producer is not None and q.producer < len(self.cand.ops):
                e_prod = self.op_err.get(q.producer, self.carried.get(q.producer))
            if e_prod is None:
                expected, e_in = CHAIN * u, 0.0
            else:
                expected, e_in = CONDITIONING * e_prod + ROUNDING * u, e_prod
            tol = self.tolerance(expected, e_in)
            # out of tolerance: its error is not explained, or comes after a divergence
            after = err > 0 and q.producer in self.tainted
            ok = err <= tol and not after
            out.append(ParamDiff(p.name, err, _ratio(p.stats, q.stats), ok, expected,
                                 after and err <= tol))
            point = DivergencePoint("param", None, _owner(p.name), None, err, expected,
                                    _amplification(err, expected), -1, p.name, q.stats.dtype,
                                    q.stats.shape, q.stats.nonfinite, p.stats.nonfinite)
            self.judge(("param", len(out)), point, tol)
        return out

    def path(self) -> tuple[DivergencePoint, ...]:
        first = self.first
        if first is None:  # the runs agree: the points nearest their tolerance
            worst = sorted(self.points.values(), key=lambda p: -_finite(p.amplification))[:5]
            return tuple(sorted(worst, key=_order))
        if first.phase != "forward" and first.phase != "backward":
            return (first,)
        chain = [first]
        ops = self.cand.ops
        current = ops[first.index]
        seen = {first.index}
        while len(chain) < BEFORE:
            best: tuple[float, DivergencePoint] | None = None
            for s in current.inputs:
                key = ("op", s) if s >= 0 else ("input", -s - 1)
                point = self.points.get(key)
                if point is not None and (best is None or _finite(point.error) > best[0]):
                    best = (_finite(point.error), point)
            if best is None or (best[1].phase != "input" and best[1].index in seen):
                break
            chain.append(best[1])
            if best[1].phase == "input":
                break
            seen.add(best[1].index)
            current = ops[best[1].index]
        after = [self.points[("op", op.index)] for op in ops[first.index + 1:]
                 if ("op", op.index) in self.points and first.index in op.inputs][:AFTER]
        return tuple(reversed(chain)) + tuple(after)


def _rms(st: Stats) -> float:
    n = st.numel
    return st.norm / math.sqrt(n) if n and math.isfinite(st.norm) else 0.0


def _amplification(error: float, expected: float) -> float:
    if expected == 0.0 or math.isinf(expected):
        return (1.0 if math.isinf(error) else 0.0) if math.isinf(expected) else math.inf
    return error / expected


def _finite(x: float) -> float:
    return 1e300 if math.isinf(x) or math.isnan(x) else x


def _order(p: DivergencePoint) -> tuple[int, int]:
    return ({"input": 0, "forward": 1, "backward": 1, "param": 2}.get(p.phase, 3), p.index)


def _owner(name: str) -> str | None:
    return name.rpartition(".")[0] or None


def compare_runs(reference: NumericsRun, candidate: NumericsRun, *,
                 rtol: float | None = None) -> Divergence:
    """Where ``candidate`` leaves ``reference``: the first op whose error its inputs' error
    and the dtypes do not explain, and every parameter's gradient against the reference's.

    Args:
        reference: the run taken as right (fp32 eager, one process...).
        candidate: the run under test (bf16, compiled, a rank of a data-parallel job...).
        rtol: a relative error that is always tolerated (it replaces the dtypes' rounding
            allowance); None: the allowance of the module's docstring.

    Returns:
        A ``Divergence``: ``ok``, ``first``, ``params``, ``path``, ``summary()``.

    Raises:
        SchemaError: the runs are of different models (other parameter names or shapes), or
            were sketched differently.

    Example (``gs.record_numerics`` makes the runs; here two by hand):
        >>> from gradscope.numerics.records import OpRecord, Stats
        >>> def run(*sketch):
        ...     st = Stats("float32", (2,), 1.0, 1.0, 0, sketch + (0.0,) * 30)
        ...     return NumericsRun(ops=[OpRecord(0, "forward", "aten.exp", None, "m.py:3",
        ...                                      None, st)])
        >>> compare_runs(run(1.0, 0.5), run(1.0, 0.5)).ok
        True
        >>> d = compare_runs(run(1.0, 0.5), run(1.0, 0.6))
        >>> d.first.op, d.first.line, round(d.first.error, 3)
        ('aten.exp', 'm.py:3', 0.089)
    """
    if rtol is not None and not (rtol >= 0 and math.isfinite(rtol)):
        raise ValueError(f"rtol must be a finite number >= 0, got {rtol!r}")
    _check(reference, candidate)
    cmp = _Comparison(reference, candidate, rtol)
    leaves = cmp.leaves()
    ops_compared = reference.world == candidate.world
    compared = 0
    if ops_compared:
        compared = cmp.ops(leaves)
    else:
        for _, point in leaves.values():
            if point.name is not None and not point.name.startswith(("input", "leaf")):
                cmp.judge(("input", point.index), point, cmp.tolerance(point.expected, 0.0))
        cmp.notes.append(
            f"ops not compared: the runs have different world sizes ({reference.world} and "
            f"{candidate.world}), so each rank's ops see another part of the batch; the "
            "gradients are compared"
        )
    params = cmp.params(ops_compared)
    return Divergence(
        ok=cmp.first is None, first=cmp.first, params=tuple(params), path=cmp.path(),
        compared=compared, noise=cmp.noise, threshold=THRESHOLD, rtol=rtol,
        notes=tuple(dict.fromkeys(cmp.notes + reference.notes + candidate.notes)),
        points=tuple(sorted(cmp.points.values(), key=_order)),
    )
