"""The rich rendering of the autograd doctor's findings (``DoctorReport.render()``, what
``gradscope doctor`` prints): a verdict line, then per finding its kind and line in bold, the
message, the places involved and the fix. Every name in a finding (parameters, modules, ops,
file names) is text, never markup, its control characters made visible; lines wrap at the
console's width (80 columns in a narrow terminal) without cutting a word."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, Group
from rich.text import Text

from ..output.formats import register_renderer
from ..output.style import terminal_text
from .findings import DoctorReport, Finding

_KIND_STYLE = {"inplace": "bold red", "backward_twice": "bold red", "no_grad_fn": "bold red"}


def verdict(report: DoctorReport) -> str:
    """``report.verdict()``: ``3 findings (1 inplace, 2 grad_none) in 1 backward, ...``."""
    return report.verdict()


class _Indented:
    """Paragraphs wrapped at the console's width, less an indent, each line only as long as
    its words (no padding to the width)."""

    def __init__(self, texts: list[Text], indent: int = 2, end: bool = True) -> None:
        self.texts = texts
        self.indent = indent
        self.end = end

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        width = max(options.max_width - self.indent, 20)
        for text in self.texts:
            for line in text.wrap(console, width):
                line.rstrip()
                yield Text(" " * self.indent) + line
        if self.end:
            yield Text("")


def _finding(f: Finding) -> Group:
    head = Text(terminal_text(f.title()), style=_KIND_STYLE.get(f.kind, "bold yellow"))
    if f.module:
        head.append(f"  [{terminal_text(f.module)}]", style="dim")
    body: list[Text] = [Text(terminal_text(f.message))]
    for site in f.sites:
        body.append(Text(f"- {terminal_text(site.describe())}", style="dim"))
    fix = Text("fix: ", style="bold green")
    fix.append(terminal_text(f.fix))
    body.append(fix)
    return Group(head, _Indented(body))


def render_report(report: DoctorReport) -> Group:
    """The findings, first the ones that broke backward."""
    parts: list[Text | Group] = [Text(terminal_text(verdict(report)),
                                      style="bold" if report.healthy else "bold red")]
    parts.extend(_finding(f) for f in report.findings)
    parts.extend(Text(f"note: {terminal_text(n)}", style="dim") for n in report.notes)
    return Group(*parts)


register_renderer("doctor", render_report)
