"""The rich rendering of a ``Divergence`` (``Divergence.render()``, what ``gradscope compare``
prints): the verdict in one paragraph, a table of the path from the inputs to the first
divergence and a few ops after (each row: phase, op, where (the line, the module), dtype,
error, amplification: the error over what its inputs and dtype explain; the divergent row in
red), then the gradients out of tolerance. Every name from a model (modules, parameters,
files) is text, never markup."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..output.formats import register_renderer
from ..output.style import terminal_text
from .records import Divergence, DivergencePoint, ParamDiff

#: dtypes as the table writes them
_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
#: Gradients listed before "... and N more".
SHOWN_PARAMS = 10


def _num(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}" if x < 1e-2 or x >= 1e3 else f"{x:.3g}"


def _row(p: DivergencePoint, first: DivergencePoint | None) -> list[Text]:
    style = "bold red" if p == first else ""
    what = p.op or p.name or ""
    where = " ".join(w for w in (p.line, p.module) if w)
    return [Text(terminal_text(p.phase), style=style), Text(terminal_text(what), style=style),
            Text(terminal_text(where), style="dim"),
            Text(terminal_text(_SHORT.get(p.dtype, p.dtype))),
            Text(terminal_text(_num(p.error)), style=style),
            Text(terminal_text(_ampl(p.amplification)), style=style)]


def _ampl(x: float) -> str:
    """``12.5x``; ``new`` where only the candidate is not finite (nothing explains it)."""
    return "new" if math.isinf(x) else _num(x) + "x"


def path_table(d: Divergence) -> Table:
    """The path's points as a table (the first divergence in bold red)."""
    title = "path to the first divergence" if d.first is not None else "closest to tolerance"
    table = Table(title=terminal_text(title), title_justify="left", show_edge=False,
                  pad_edge=False)
    for name, justify in (("phase", "left"), ("op", "left"), ("where", "left"),
                          ("dtype", "left"), ("error", "right"), ("ampl.", "right")):
        table.add_column(terminal_text(name), justify=justify,  # type: ignore[arg-type]
                         overflow="fold")
    for p in d.path:
        table.add_row(*_row(p, d.first))
    return table


def _param(p: ParamDiff) -> Text:
    text = Text(f"  {terminal_text(p.name)}: ", style="bold red")
    if math.isinf(p.rel_error):
        text.append("non-finite, or only one run has it")
    else:
        why = ("made after the first divergence" if p.after_divergence
               else f"expected {_num(p.expected)}")
        text.append(f"ratio {_num(p.ratio)}, relative error {_num(p.rel_error)} ({why})")
    return text


def render_divergence(d: Divergence) -> Group:
    """The verdict, the path table, the gradients out of tolerance, the notes."""
    parts: list[Text | Table] = [
        Text(terminal_text(d.summary(), limit=4000), style="bold" if d.ok else "bold red")
    ]
    if d.path:
        parts.append(path_table(d))
    bad = d.bad_params
    if bad:
        parts.append(Text("gradients out of tolerance:", style="bold"))
        parts.extend(_param(p) for p in bad[:SHOWN_PARAMS])
        if len(bad) > SHOWN_PARAMS:
            parts.append(Text(f"  ... and {len(bad) - SHOWN_PARAMS} more"))
    return Group(*parts)


register_renderer("numerics", render_divergence)
