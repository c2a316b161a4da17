"""One style for every view: torchviz's colours, the labels of tensors, and ONE gradient-norm
scale, used by DOT (edge colours), the terminal tree (text styles) and the HTML page (which gets
the same bands as data), so a norm has the same colour everywhere.

The scale is a set of bands on the norm's magnitude (log scale): vanishing, small, normal,
large, exploding; a non-finite norm is its own band (red, and drawn thicker).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# torchviz's legend, so its users feel at home.
LEAF_COLOR = "lightblue"
SAVED_COLOR = "orange"
OUTPUT_COLOR = "darkolivegreen1"
BASE_COLOR = "darkolivegreen3"
CUSTOM_COLOR = "plum1"
FREED_COLOR = "gray90"
BAD_COLOR = "red"
MODULE_COLOR = "lightyellow"
FOLDED_COLOR = "lightgoldenrod1"
CLUSTER_ATTR = 'style="rounded,dashed" color=gray50 fontsize=10 fontname=monospace labeljust=l'


@dataclass(frozen=True)
class NormBand:
    """One band of the gradient-norm scale: norms below ``upper`` (and above the band before).

    Attributes:
        name: ``vanishing``, ``small``, ``normal``, ``large``, ``exploding`` or ``non-finite``.
        upper: exclusive upper bound of the band (``inf`` for the last finite band).
        color: the colour in DOT and HTML (``#rrggbb``).
        style: the ``rich`` text style in the terminal.
    """

    name: str
    upper: float
    color: str
    style: str


#: The gradient-norm scale, lowest band first.
NORM_BANDS: tuple[NormBand, ...] = (
    NormBand("vanishing", 1e-6, "#2c4fd6", "blue"),
    NormBand("small", 1e-3, "#1593a8", "cyan"),
    NormBand("normal", 1e2, "#2a9a3f", "green"),
    NormBand("large", 1e4, "#c98a00", "yellow"),
    NormBand("exploding", math.inf, "#e0301e", "red"),
)
#: The band of NaN and infinite norms.
NONFINITE_BAND = NormBand("non-finite", math.nan, BAD_COLOR, "bold red")


def norm_band(norm: float) -> NormBand:
    """The band of ``norm`` on the one gradient-norm scale.

    Example:
        >>> norm_band(0.5).name, norm_band(2e-7).name, norm_band(float("nan")).name
        ('normal', 'vanishing', 'non-finite')
    """
    if not math.isfinite(norm):
        return NONFINITE_BAND
    for band in NORM_BANDS:
        if norm < band.upper:
            return band
    return NORM_BANDS[-1]


def norm_color(norm: float) -> str:
    """Colour of a gradient norm in DOT and HTML (see ``NORM_BANDS``)."""
    return norm_band(norm).color


def norm_style(norm: float) -> str:
    """``rich`` style of a gradient norm in the terminal (see ``NORM_BANDS``)."""
    return norm_band(norm).style


def format_norm(norm: float) -> str:
    """A norm as the views print it: ``1.23e-04``, ``nan``, ``inf``."""
    if math.isnan(norm):
        return "nan"
    if math.isinf(norm):
        return "inf"
    return f"{norm:.2e}"


def size_to_str(shape: Sequence[int | None] | None) -> str:
    """``(3, 4)`` as torchviz writes sizes; a ragged dimension (nested tensors) is ``*``."""
    if shape is None:
        return "(?)"
    return "(" + ", ".join("*" if v is None else str(int(v)) for v in shape) + ")"


def var_label(name: str | None, shape: Sequence[int | None] | None) -> str:
    """torchviz's tensor label: name, newline, space, size."""
    return f"{name or ''}\n {size_to_str(shape)}"
