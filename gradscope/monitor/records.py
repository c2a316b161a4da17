"""The host rows of a logged step as plain records: ``ParamStats`` per parameter and module."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .log import ParamStats
from .measure import Recount
from .stats import (
    MAX_ABS,
    NONZERO,
    NORM,
    SUM_ABS,
    combine_calls,
)

_new = object.__new__
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
    by_param: dict[int, ParamStats] = {}
    norms = table[NORM]
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
        max_abs: float | None = None
        mean_abs: float | None = None
        zero_frac: float | None = None
        if full:
            numel = numels[i]
            nonzero = table[NONZERO][j]
            max_abs, mean_abs = table[MAX_ABS][j], table[SUM_ABS][j] / numel
            zero_frac = (numel - nonzero) / numel
        ratio: float | None = None
        if with_update:
            ratio = _ratio(upd[j], wgt[j])
        by_param[i] = _make_stats(
            norm=norm,
            max_abs=max_abs,
            mean_abs=mean_abs,
            nan=nan,
            inf=inf,
            zero_frac=zero_frac,
            update_ratio=ratio,
        )
    return {names[i]: by_param[i] for i in sorted(by_param)}


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
        norm, max_abs, sum_abs, nonzero, nan, inf, numel = combine_calls(mods[i], norm_type)
        out[names[i]] = ParamStats(
            norm=norm,
            max_abs=max_abs,
            mean_abs=sum_abs / numel,
            nan=int(nan),
            inf=int(inf),
            zero_frac=(numel - nonzero) / numel,
        )
    return out
