"""The registry of output formats, and of renderers for the plain records.

The model owns the registry; the views fill it when ``gradscope`` is imported (each file in
``gradscope/views/`` registers what it draws), so the model never imports a view
(dependency inversion, as Pillow's ``Image.register_save``). ``Graph.save``, ``Graph.render``,
``Graph.to_dot``, ``_repr_svg_`` and the CLI's ``--format`` all go through it.

Adding an output format is one file in ``views/`` that calls ``register_format`` with
``OutputFormat(name, render, options=..., kind=FormatKind.PICTURE, available=...)`` and one
import line in ``views/__init__.py``; ``gs.FORMATS`` and ``gradscope render --format`` pick it up
from here. Its ``kind`` says what the CLI makes of it (a picture gets a bounded, readable view; a
page opens modules itself; data gets every node), its ``available`` whether it can be written on
this machine (the Graphviz binary for SVG/PNG/PDF), checked before a model file runs.

Records (``MemoryReport``, ``CheckResult``...) reach their rich renderings the same way:
``register_renderer(kind, fn)`` by a view, ``renderer(kind)`` by the record's method. What such a
renderer returns for the terminal (a rich renderable) comes back wrapped in a ``Printable``: rich
prints it as before, and ``print(mon.report())`` or ``str()`` gives its plain text (through the
``text`` renderer, ``gradscope.render.text``), so this module never imports rich.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from ..errors import FormatError, GradscopeError
from ..graph.nodes import GraphLike
from .files import write_atomic


class FormatKind(Enum):
    """What a format is to its reader, which decides what of a graph is worth writing."""

    #: one picture laid out by Graphviz (SVG, PNG, PDF, and DOT, its source): a bounded,
    #: readable view
    PICTURE = "picture"
    #: an interactive page that opens and closes modules itself (HTML): the whole graph
    PAGE = "page"
    #: data for a program (JSON): every node, unless a depth is asked for
    DATA = "data"


def _always() -> bool:
    return True


@dataclass(frozen=True)
class OutputFormat:
    """One way of writing a ``Graph``.

    Attributes:
        name: the format's name and file suffix (``svg``).
        render: ``render(graph, **options) -> bytes``.
        options: the keyword options ``render`` takes; any other option is refused.
        description: one line for ``--help``.
        binary: the bytes are not text (PNG, PDF).
        kind: a picture, a page or data (``FormatKind``).
        available: ``available() -> bool``: can it be written here (e.g. Graphviz present)?
        unavailable: ``unavailable(name) -> GradscopeError``: the error that says how to make it
            available (default: a ``FormatError`` naming the format).

    Example:
        >>> fmt = OutputFormat("txt", lambda graph: b"", kind=FormatKind.DATA)
        >>> fmt.kind.value, fmt.available()
        ('data', True)
    """

    name: str
    render: Callable[..., bytes]
    options: frozenset[str] = field(default_factory=frozenset)
    description: str = ""
    binary: bool = False
    kind: FormatKind = FormatKind.DATA
    available: Callable[[], bool] = _always
    unavailable: Callable[[str], GradscopeError] | None = None

    def require(self) -> None:
        """Raise the format's own error when it cannot be written on this machine.

        Raises:
            GradscopeError: ``available()`` is false (for SVG: ``GraphvizNotFoundError``).
        """
        if not self.available():
            if self.unavailable is not None:
                raise self.unavailable(self.name)
            raise FormatError(f"the {self.name} format cannot be written on this machine")


_FORMATS: dict[str, OutputFormat] = {}
_RENDERERS: dict[str, Callable[..., Any]] = {}


def register_format(fmt: OutputFormat) -> None:
    """Make ``fmt`` available to ``Graph.save``/``render`` and the CLI (a later one replaces
    an earlier one of the same name)."""
    _FORMATS[fmt.name] = fmt


def format_names() -> tuple[str, ...]:
    """The names of the registered formats, in registration order."""
    return tuple(_FORMATS)


def get_format(name: str) -> OutputFormat:
    """The format called ``name`` (case and a leading dot ignored): its kind, options and
    availability (``gs.format_spec``).

    Raises:
        FormatError: no such format is registered.
    """
    key = name.lower().lstrip(".")
    fmt = _FORMATS.get(key)
    if fmt is None:
        known = ", ".join(_FORMATS) or "none (import gradscope to register them)"
        raise FormatError(
            f"unknown output format {key!r}; use one of {known} "
            "(given by --format or by the output file's suffix)"
        )
    return fmt


def format_for(path: str | Path | None, fmt: str | None) -> str:
    """The format asked for, else the one the path's suffix names.

    Raises:
        FormatError: the format (or the suffix) is not a registered one, or the format asked
            for is not the one the suffix names (SVG bytes in ``x.png``).
    """
    names = ", ".join(_FORMATS)
    if fmt:
        name = get_format(fmt).name
        if path is None:
            return name
        suffix = Path(path).suffix.lower().lstrip(".")
        if suffix in _FORMATS and suffix != name:
            raise FormatError(
                f"the format {name} and the output {str(path)!r} disagree: that name says "
                f"{suffix}; name the file {Path(path).with_suffix('.' + name).name!r}, "
                "or drop the format"
            )
        return name
    if path is None:
        raise FormatError(f"no output format given; pass one of {names}")
    suffix = Path(path).suffix
    if not suffix:
        raise FormatError(
            f"cannot tell the output format of {str(path)!r}: it has no suffix; "
            f"name it e.g. graph.svg, or pass a format ({names})"
        )
    return get_format(suffix).name


def format_options(name: str) -> frozenset[str]:
    """The options the format called ``name`` takes (``gs.format_options("json")`` is empty).

    Raises:
        FormatError: no such format.
    """
    return get_format(name).options


def check_options(fmt: OutputFormat, options: Iterable[str]) -> None:
    """Refuse options that ``fmt`` does not take (a DOT option is no JSON option)."""
    extra = sorted(set(options) - fmt.options)
    if extra:
        takes = ", ".join(sorted(fmt.options)) or "no options"
        raise FormatError(
            f"the {fmt.name} format does not take {', '.join(extra)}; it takes {takes}"
        )


def render_graph(graph: GraphLike, fmt: str, **options: Any) -> bytes:
    """``graph`` rendered in ``fmt`` with ``options`` (checked against what it takes)."""
    spec = get_format(fmt)
    check_options(spec, options)
    return spec.render(graph, **options)


def save_graph(
    graph: GraphLike, path: str | Path, format: str | None = None, **options: Any
) -> Path:
    """Write ``graph`` to ``path`` in ``format`` (default: from the suffix), atomically: the
    bytes go to a temporary file in the same folder, renamed over ``path`` once complete."""
    path = Path(path)
    data = render_graph(graph, format_for(path, format), **options)
    return write_atomic(path, data)


class Printable:
    """A rich renderable that is also text: rich prints it as it printed the renderable, and
    ``str()`` (so ``print()``) gives its plain text, without escape codes, as wide as the terminal
    (100 columns when standard output is not one).

    Every renderable a registered renderer returns comes back as one of these, so
    ``print(monitor.report())`` shows the report rather than ``<rich.console.Group object>``.
    The renderable's own attributes are still reachable (``printable.renderables``), and
    ``printable.renderable`` is the renderable itself.

    Example (the text renderer is registered when ``gradscope`` is imported)::

        print(monitor.report())        # the table as text, as rich.print draws it
        rich.print(monitor.report())   # the same, in colour
    """

    __slots__ = ("renderable",)

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich__(self) -> Any:
        return self.renderable

    def __str__(self) -> str:
        return str(renderer("text")(self.renderable))

    def __repr__(self) -> str:  # the interpreter's echo of `mon.report()` shows the report
        return str(self)

    def __getattr__(self, name: str) -> Any:
        if name == "renderable":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.renderable, name)


def _is_renderable(value: Any) -> bool:
    """Whether rich would draw ``value`` itself (it has ``__rich__``/``__rich_console__``):
    bytes, strings, paths and records pass through unwrapped."""
    if isinstance(value, Printable):
        return False
    kind = type(value)
    return hasattr(kind, "__rich_console__") or hasattr(kind, "__rich__")


def _printable(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        value = fn(*args, **kwargs)
        return Printable(value) if _is_renderable(value) else value

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = getattr(fn, "__name__", "renderer")
    call.__doc__ = fn.__doc__
    return call


class Shown:
    """A record drawn by the view registered under its ``VIEW`` (``register_renderer``):
    ``render()`` is the rich renderable the CLI prints, ``print(record)`` shows its text, and
    rich draws the record itself. (The one place records get their ``render``/``__str__``/
    ``__rich__``.)"""

    VIEW: ClassVar[str]

    def render(self) -> Any:
        """A rich renderable: what ``gradscope`` prints for this record."""
        return renderer(self.VIEW)(self)

    def __str__(self) -> str:
        """The text of ``render()``: ``print(record)`` shows what the terminal would."""
        return str(self.render())

    def __rich__(self) -> Any:
        return self.render()


def register_renderer(kind: str, fn: Callable[..., Any]) -> None:
    """Register the view that draws records of ``kind`` (``memory``, ``check``...)."""
    _RENDERERS[kind] = fn


def renderer(kind: str) -> Callable[..., Any]:
    """The view registered for ``kind``; a rich renderable it returns comes back as a
    ``Printable`` (rich draws it, ``str()`` is its text).

    Raises:
        FormatError: none is registered (the views were not imported).
    """
    fn = _RENDERERS.get(kind)
    if fn is None:
        raise FormatError(
            f"no renderer for {kind} records is registered; import gradscope (which registers "
            "its views) before rendering"
        )
    return _printable(fn)
