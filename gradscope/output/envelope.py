"""One envelope for every JSON document gradscope writes, and one encoding of NaN and Inf.

Every document (a graph, an activation report, a step's memory, the doctor's findings, the
first line of the monitor's JSON Lines) is a JSON object that starts with the same two keys::

    {"gradscope": 4, "kind": "graph", ...}

``"gradscope"`` is the version of that kind's format (an int), ``"kind"`` one of ``KINDS``.
Strict JSON has no NaN or Infinity: a non-finite number is written as the string ``"nan"``,
``"inf"`` or ``"-inf"`` wherever a number may stand (``json_float``), and read back by
``float_from_json``. Documents written before the envelope are still read: a graph whose
``"gradscope"`` is 1 to 3 (no ``"kind"``), and ``{"gradscope_activations": 1}``,
``{"gradscope_step_memory": 1}``, ``{"gradscope_doctor": 1}`` (``open_document``); a monitor
log whose first line has no envelope, and whose non-finite figures are null beside a
``"nonfinite"`` map, reads as before (``gradscope.monitor.log.read_jsonl``).

Example:
    >>> doc = envelope("doctor", {"findings": []})
    >>> doc
    {'gradscope': 2, 'kind': 'doctor', 'findings': []}
    >>> open_document(doc, "doctor")["findings"], open_document({"gradscope_doctor": 1}, "doctor")
    ([], {'gradscope': 1, 'kind': 'doctor'})
    >>> json_float(float("-inf")), float_from_json("nan") != float_from_json("nan")
    ('-inf', True)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import SchemaError

#: The key every document starts with: its format's version, an int.
VERSION_KEY = "gradscope"
#: Each kind of document and the version of its format that this gradscope writes.
KINDS: dict[str, int] = {
    "graph": 4,
    "activations": 2,
    "step_memory": 3,
    "doctor": 2,
    "monitor": 2,
    "numerics": 1,
    "numerics_compare": 1,
}
#: The key of each kind's documents before the envelope (their version was 1).
LEGACY_KEYS: dict[str, str] = {
    "activations": "gradscope_activations",
    "step_memory": "gradscope_step_memory",
    "doctor": "gradscope_doctor",
}
#: How a non-finite float is written, and read back.
NONFINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_WRITTEN_BY = {
    "graph": "Graph.to_json() or gradscope render -o graph.json",
    "activations": "ActivationReport.write_json() or gradscope memory --json",
    "step_memory": "StepMemory.write_json() or gradscope memory --step --json",
    "doctor": "gs.doctor(...).write_json() or gradscope doctor --json",
    "monitor": "GradMonitor.to_jsonl()/to_json() or gradscope report --jsonl/--json",
    "numerics": "NumericsRun.save() (gs.record_numerics)",
    "numerics_compare": "Divergence.write_json() or gradscope compare --json",
}


def envelope(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` behind the envelope of ``kind`` (its two keys first)."""
    return {VERSION_KEY: KINDS[kind], "kind": kind, **body}


def open_document(data: Any, kind: str, *, readable: tuple[int, ...] = ()) -> dict[str, Any]:
    """The document ``data`` after checking that it is a ``kind`` this gradscope reads.

    Returns the dict with ``"gradscope"`` (its version) and ``"kind"`` set, whichever
    envelope it came in. ``readable``: the versions of ``kind`` that may come without a
    ``"kind"`` key (a graph's 1 to 3).

    Raises:
        SchemaError: not a gradscope document of that kind, or a version this gradscope does
            not read; the message says what wrote the expected one.
    """
    wanted = f'{{"gradscope": {KINDS[kind]}, "kind": "{kind}"}}'
    made_by = _WRITTEN_BY[kind]
    if not isinstance(data, dict):
        raise SchemaError(f"not a gradscope {kind} document: expected a JSON object with "
                          f"{wanted} (write one with {made_by})")
    legacy = LEGACY_KEYS.get(kind)
    if legacy is not None and legacy in data and VERSION_KEY not in data:
        if data[legacy] != 1:
            raise SchemaError(f"{legacy}: unsupported version {json.dumps(data[legacy])}")
        rest = {k: v for k, v in data.items() if k != legacy}
        return {VERSION_KEY: 1, "kind": kind, **rest}
    if VERSION_KEY not in data:
        raise SchemaError(f"not a gradscope {kind} document: expected a JSON object with "
                          f"{wanted} (write one with {made_by})")
    version, found = data[VERSION_KEY], data.get("kind")
    if found is None and type(version) is int and version in readable:
        return {**data, "kind": kind}
    if found != kind:
        raise SchemaError(f"a gradscope {found or 'unknown'} document, not {kind} "
                          f"(expected {wanted}; write one with {made_by})")
    if type(version) is not int or not 1 <= version <= KINDS[kind]:
        raise SchemaError(
            f"gradscope: unsupported {kind} version {json.dumps(version)}; this gradscope "
            f"reads versions up to {KINDS[kind]} (a newer gradscope wrote it? upgrade gradscope)"
        )
    return data


def json_float(x: float, digits: int | None = None) -> float | str:
    """``x`` for strict JSON: NaN and the infinities as ``"nan"``, ``"inf"``, ``"-inf"``;
    with ``digits``, a finite ``x`` rounded to that many significant digits.

    Example:
        >>> json_float(float("nan")), json_float(-math.inf), json_float(0.123456, 4)
        ('nan', '-inf', 0.1235)
    """
    if x != x:
        return "nan"
    if x in (math.inf, -math.inf):
        return "inf" if x > 0 else "-inf"
    return x if digits is None else float(f"{x:.{digits}g}")


def float_from_json(v: Any) -> float:
    """The inverse of ``json_float`` (a number, or one of its three strings)."""
    if isinstance(v, str):
        try:
            return NONFINITE[v]
        except KeyError:
            raise SchemaError(f'expected a number, "nan", "inf" or "-inf", got {v!r}') from None
    return float(v)


def dumps(data: Any, *, indent: int | None = 1) -> str:
    """JSON text the way every document is written: strict (no NaN), UTF-8 kept."""
    return json.dumps(data, indent=indent, allow_nan=False, ensure_ascii=False)


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as a JSON document to ``path`` atomically; returns the path."""
    from .files import write_atomic

    return write_atomic(Path(path), dumps(data) + "\n")
