"""The CLI's last-resort handlers, reached in-process: an exception that no earlier clause
takes (a bug of ours) is still one line with exit 3 (issue 18), and typer's Abort is an
interruption."""

from __future__ import annotations

import gradscope_cli.main as cli_main
import pytest
import typer


def _run_raising(monkeypatch, capsys, exc: BaseException) -> tuple[int, str]:
    def app(*args, **kwargs):
        raise exc

    monkeypatch.setattr(cli_main, "app", app)
    monkeypatch.delenv("GRADSCOPE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        cli_main.main(["tree", "m.py"])
    return info.value.code, capsys.readouterr().err


def test_a_bug_of_ours_is_one_line_with_exit_3(monkeypatch, capsys) -> None:
    code, err = _run_raising(monkeypatch, capsys, RuntimeError("broken invariant"))
    assert code == 3
    assert err.strip().splitlines() == [
        "gradscope: internal error: RuntimeError: broken invariant "
        "(GRADSCOPE_DEBUG=1 shows the traceback)"
    ]


def test_typer_abort_is_an_interruption(monkeypatch, capsys) -> None:
    code, err = _run_raising(monkeypatch, capsys, typer.Abort())
    assert code == 130 and err.strip() == "gradscope: interrupted"
