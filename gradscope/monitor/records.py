"""The host rows of a logged step as plain records: ``ParamStats`` per parameter and module."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .log import ParamStats
from .measure import Recount
from .stats import FULL_ROWS, FULL_STATS, NORM, combine_calls, finish

_new = object.__new__
_FULL_FIELDS = tuple(stat.field for stat in FULL_STATS)
_set = object.__setattr__


def _make_stats(**fields: Any) -> ParamStats:
    # once per parameter per logged step: set the frozen instance's __dict__ at once rather than
    # through the dataclass __init__ (seven object.__setattr__ calls); the instance is the same
    ps = _new(ParamStats)
    _set(ps, "__dict__", fields)
    return ps


def param_stats(
    names: Sequence[str],
    numels: Sequence[int],
    cols: Sequence[int],
    table: Sequence[Sequence[float]],
    counts: dict[int, Recount],
    full: bool,
    with_update: bool,
) -> dict[str, ParamStats]:
    """``ParamStats`` in model order from the host rows of the step's matrix."""
    norms = table[NORM]
    if not full and not with_update and not counts:
        return _norms_only(names, cols, norms)
    by_param: dict[int, ParamStats] = {}
    if with_update:
        upd, wgt = table[-2], table[-1]
    for j, i in enumerate(cols):
        norm = norms[j]
        nan: int | None = 0
        inf: int | None = 0
        if j in counts:
            nan, inf, norm64 = counts[j]
            if nan == 0 and inf == 0:
                norm = norm64  # finite values whose norm overflowed or underflowed
        fields: dict[str, Any] = dict.fromkeys(_FULL_FIELDS)
        if full:
            fields = finish([row[j] for row in table[1:FULL_ROWS]], numels[i])
        ratio: float | None = None
        if with_update:
            ratio = _ratio(upd[j], wgt[j])
        by_param[i] = _make_stats(norm=norm, nan=nan, inf=inf, update_ratio=ratio, **fields)
    return {names[i]: by_param[i] for i in sorted(by_param)}


def _norms_only(
    names: Sequence[str], cols: Sequence[int], norms: Sequence[float]
) -> dict[str, ParamStats]:
    """The usual logged step (norms only, all finite and countable): one ``ParamStats`` per
    column, each made from one shared template of its other fields."""
    template = {"nan": 0, "inf": 0, "update_ratio": None, **dict.fromkeys(_FULL_FIELDS)}
    made = []
    for norm in norms:
        ps = _new(ParamStats)
        _set(ps, "__dict__", {**template, "norm": norm})
        made.append(ps)
    if isinstance(cols, range) or all(a < b for a, b in zip(cols, cols[1:])):
        return dict(zip([names[i] for i in cols], made, strict=True))
    return {names[i]: made[j] for j, i in sorted(enumerate(cols), key=lambda ji: ji[1])}


def _ratio(u: float, w: float) -> float:
    return u / w if w > 0 else (math.inf if u > 0 else 0.0)


def update_ratios(
    names: Sequence[str], cols: Sequence[int], rows: Sequence[Sequence[float]]
) -> dict[str, float]:
    """The update-to-weight ratio by parameter name from the two update rows (norm of the
    sampled change, of the sampled old weights), column ``j`` being parameter ``cols[j]``."""
    upd, wgt = rows[0], rows[1]
    return {names[i]: _ratio(upd[j], wgt[j]) for j, i in enumerate(cols)}


def module_stats(
    names: Sequence[str], mods: dict[int, list[list[float]]], norm_type: float
) -> dict[str, ParamStats]:
    out = {}
    for i in sorted(mods):
        norm, *raw = combine_calls(mods[i], norm_type)
        nan, inf, numel = raw[FULL_ROWS - 1 :]
        out[names[i]] = ParamStats(
            norm=norm, nan=int(nan), inf=int(inf), **finish(raw[: FULL_ROWS - 1], int(numel))
        )
    return out
