"""One style for every view: torchviz's colours, the labels of tensors, and ONE gradient-norm
scale, used by DOT (edge colours), the terminal tree (text styles) and the HTML page (which gets
the same bands as data), so a norm has the same colour everywhere.

The scale is a set of bands on the norm's magnitude (log scale): vanishing, small, normal,
large, exploding; a non-finite norm is its own band (red, and drawn thicker).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Span, Text

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


# ---------------------------------------------------------------------- text from data
#: Characters no view writes as they are: C0 and C1 control characters and DEL (a terminal acts
#: on ESC sequences, Graphviz stops at NUL), the bidirectional controls that reorder what a
#: reader sees (Trojan Source), line/paragraph separators, and lone surrogates (no encoding
#: can write them: ``"\ud800".encode("utf-8")`` raises).
UNSAFE_CHARS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE_NO_NL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]"
)


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean_text(s: str, *, newlines: bool = False) -> str:
    """``s`` with every character of ``UNSAFE_CHARS`` written as a visible escape (``\\x1b``,
    ``\\u202e``, ``\\ud800``), so a name from a model or a file can neither act on a terminal
    nor fail to encode; ``newlines`` keeps ``\\n`` as it is (a label line break).

    Example:
        >>> clean_text("a\\x1b[31mb\\ud800"), clean_text("x\\ny", newlines=True)
        ('a\\\\x1b[31mb\\\\ud800', 'x\\ny')
    """
    pattern = _UNSAFE_NO_NL if newlines else UNSAFE_CHARS
    return pattern.sub(_visible, s) if pattern.search(s) else s


def clean_rich(text: Text) -> Text:
    """A ``rich`` ``Text`` with the unsafe characters of its plain text written as visible
    escapes (``clean_text``), styles kept. ``Text`` itself never reads markup, so ``[b]`` and
    ``[/]`` in a name stay text."""
    plain = text.plain
    if not UNSAFE_CHARS.search(plain):
        return text
    cuts: list[int] = []
    for m in UNSAFE_CHARS.finditer(plain):
        cuts += [m.start(), m.end()]
    out = Text(style=text.style, justify=text.justify, overflow=text.overflow,
               no_wrap=text.no_wrap, end=text.end)
    for piece in text.divide(cuts):
        p = piece.plain
        if len(p) == 1 and UNSAFE_CHARS.match(p):
            esc = _visible(UNSAFE_CHARS.match(p))  # type: ignore[arg-type]
            piece = Text(esc, style=piece.style,
                         spans=[Span(0, len(esc), sp.style) for sp in piece.spans])
        out.append_text(piece)
    return out


#: The most characters of one string from data that a terminal view shows; the rest is cut
#: and counted (a 50 MB name must not fill the terminal).
MAX_SHOWN = 1000


def terminal_text(value: object, *, limit: int = MAX_SHOWN) -> str:
    """THE escaping function of every terminal view: ``str(value)`` cut to ``limit``
    characters (the rest counted: ``… (+N characters)``), every character of
    ``UNSAFE_CHARS`` written as a visible escape (``clean_text``). Used as ``Text`` (never
    markup), so ``[b]``, ``[/]`` and ``[link=...]`` stay text.

    Example:
        >>> terminal_text("[b]x\\x1b[2J"), terminal_text("ab" * 10, limit=4)
        ('[b]x\\\\x1b[2J', 'abab… (+16 characters)')
    """
    s = value if isinstance(value, str) else str(value)
    if len(s) > limit:
        s = f"{s[:limit]}… (+{len(s) - limit} characters)"
    return clean_text(s)


def cell(value: object, style: str = "", *, limit: int = MAX_SHOWN) -> Text:
    """A rich ``Text`` of ``terminal_text(value)``: what every table cell, title and line of
    data in a terminal view is made of (a ``str`` handed to rich would be read as markup)."""
    return Text(terminal_text(value, limit=limit), style=style)
