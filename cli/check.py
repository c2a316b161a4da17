"""``gradscope check FILE:NAME``: gradcheck a custom Function (or function) defined in a file.

The file supplies the inputs as ``NAME_inputs()`` (a function returning a tuple of arguments),
or as ``example_inputs`` (a tuple, or a function returning one). Exit codes: 0 the check passed,
1 it failed, 2 the file, the name or the inputs could not be used.
"""

from __future__ import annotations

from typing import Any

import typer

import gradscope as gs

from .common import FUNCTION_FILE_EPILOG, model_code, show, stdout

_HINT = (
    "define {name}_inputs() returning a tuple of arguments, e.g.\n"
    "    def {name}_inputs():\n"
    "        return (torch.randn(3, 4, dtype=torch.float64, requires_grad=True), 1.5)"
)


def _is_checkable(obj: Any) -> bool:
    import torch

    if isinstance(obj, type):
        return issubclass(obj, torch.autograd.Function)
    return callable(obj) and not isinstance(obj, torch.nn.Module)


def _candidates(mf: gs.ModelFile) -> str:
    import torch

    names = [
        n for n, v in vars(mf.module).items()
        if not n.startswith("_") and isinstance(v, type) and issubclass(v, torch.autograd.Function)
        and v is not torch.autograd.Function
    ]
    return ", ".join(names) if names else "none"


def _target(mf: gs.ModelFile, name: str) -> Any:
    if not mf.has(name):
        raise gs.CheckInputError(
            f"{mf.path}: no name {name!r} (Function subclasses in the file: {_candidates(mf)})"
        )
    obj = mf.get(name)
    if not _is_checkable(obj):
        raise gs.CheckInputError(
            f"{mf.path}: {name} is a {type(obj).__name__}; expected a torch.autograd.Function "
            "subclass or a function of tensors"
        )
    return obj


def load_inputs(mf: gs.ModelFile, name: str) -> tuple[Any, ...]:
    """The arguments to check ``name`` with: ``NAME_inputs()`` or else ``example_inputs``."""
    label = f"{name}_inputs"
    source = mf.get(label)
    if source is None:
        label = "example_inputs"
        source = mf.get(label)
    if source is None:
        raise gs.CheckInputError(
            f"{mf.path}: no {name}_inputs() or example_inputs to call {name} with; "
            + _HINT.format(name=name)
        )
    value = mf.call(f"calling {label}()", source) if callable(source) else source
    import torch

    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and not value:
        raise gs.CheckInputError(
            f"{mf.path}: {label} gave no arguments (an empty {type(value).__name__}); give at "
            f"least one tensor to check {name} with, " + _HINT.format(name=name)
        )
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise gs.CheckInputError(
        f"{mf.path}: {label} gave a {type(value).__name__}; expected a tensor or a tuple of "
        "arguments"
    )


def check(
    target: str = typer.Argument(
        ..., metavar="FILE:NAME", help="e.g. functions.py:ClippedReLU (gradscope example functions)"
    ),
    double: bool = typer.Option(
        True, "--double/--no-double", help="Also run gradgradcheck (second derivatives)."
    ),
) -> None:
    """gradcheck (and gradgradcheck) a torch.autograd.Function subclass or function in FILE."""
    with model_code():
        mf = gs.load_model_file(target)  # parses FILE:NAME as every command does
        name = mf.name
        if name is None:
            raise gs.CheckInputError(
                f"expected FILE:NAME, e.g. functions.py:ClippedReLU (`gradscope example "
                f"functions` writes that file), got {target!r}"
            )
        fn = _target(mf, name)
        inputs = load_inputs(mf, name)
        result = gs.check(fn, *inputs, double=double)
    show(result.render(), console=stdout(wrap=True))
    raise typer.Exit(0 if result.ok else 1)


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to the gradscope app."""
    app.command("check", epilog=FUNCTION_FILE_EPILOG)(check)
