"""The model-file contract: what ``gradscope render FILE[:NAME]`` loads and runs.

A model file is imported as a module (its folder on ``sys.path``, ``__name__`` not
``"__main__"``, so an ``if __name__ == "__main__":`` block does not run). Then:

1. ``FILE:NAME``: ``NAME`` must be a zero-argument callable or an ``nn.Module``.
2. Otherwise the first of a zero-argument callable ``build``, or the pair ``model`` (an
   ``nn.Module``) and ``example_input`` (a tensor or a tuple of tensors).
3. A callable may return outputs (a tensor or a nest of tensors), a pair ``(module, inputs)``,
   or a module alone when the file also has ``example_input``.
4. ``loss_fn`` (optional) turns the output into a loss for ``--loss``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import ModelFileError

TEMPLATE = """\
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    example_input = torch.randn(16, 4)
    def loss_fn(output): return output.pow(2).mean()   # optional: used by --loss
    # or instead: def build(): return model, example_input"""


@dataclass
class Forward:
    """What running a model file produced."""

    outputs: Any
    model: torch.nn.Module | None
    inputs: tuple[Any, ...]


def _where(exc: BaseException, path: Path) -> str:
    """``file:line`` of the deepest frame of ``exc`` inside ``path`` (else the deepest frame)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    target = str(path.resolve())
    inside = [f for f in frames if str(Path(f.filename).resolve()) == target]
    if not (inside or frames):
        return str(path)
    frame = (inside or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@contextlib.contextmanager
def _user_code(path: Path, doing: str) -> Iterator[None]:
    """Turn an exception raised by the user's code into a one-line ModelFileError."""
    try:
        yield
    except ModelFileError:
        raise
    except KeyboardInterrupt:
        raise  # the user pressed Ctrl-C: the CLI says "interrupted" and exits 130
    except SystemExit as exc:  # sys.exit() / exit() in the file: nothing to render, say so
        raise ModelFileError(
            f"{_where(exc, path)}: the file called sys.exit({exc.code!r}) (while {doing}); "
            "move that call under if __name__ == \"__main__\": (gradscope imports the file as a "
            "module, so that block does not run)"
        ) from None
    except BaseException as exc:  # the user's code may raise anything, even non-Exceptions
        raise ModelFileError(
            f"{_where(exc, path)}: {_describe(exc)} (raised while {doing})"
        ) from exc


def _zero_arg(obj: Any) -> bool:
    if not callable(obj):
        return False
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return True
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


def _as_args(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _split_spec(spec: str) -> tuple[str, str | None]:
    m = re.match(r"^(.*\.py):([A-Za-z_][A-Za-z0-9_]*)$", spec)
    if m:
        return m.group(1), m.group(2)
    return spec, None


def positional_arity(fn: Callable[..., Any]) -> int | None:
    """Number of required positional parameters of ``fn`` (None when it cannot be told)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(
        1
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


class ModelFile:
    """A loaded model file (see the module docstring for the contract).

    Example:
        >>> mf = load_model_file("samples/mlp.py")          # doctest: +SKIP
        >>> fwd = mf.forward()                              # doctest: +SKIP
        >>> graph = gradscope.trace(fwd.outputs, model=fwd.model)   # doctest: +SKIP
    """

    def __init__(self, path: Path, module: ModuleType, name: str | None) -> None:
        self.path = path
        self.module = module
        self.name = name

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, name={self.name!r})"

    def call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the user's ``fn(*args, **kwargs)``; anything it raises becomes a one-line
        ``ModelFileError`` naming the file and line (``doing`` says what was running)."""
        with _user_code(self.path, doing):
            return fn(*args, **kwargs)

    def run_model(self, module: torch.nn.Module, inputs: Any) -> Any:
        """``module(inputs)``: a tuple/list is spread as arguments, a dict as keywords."""
        args, kwargs = _as_args(inputs)
        return self.call(f"running the forward of {type(module).__name__}", module, *args, **kwargs)

    @property
    def loss_takes_target(self) -> bool:
        """Whether the file's ``loss_fn`` takes ``(output, target)`` rather than ``(output)``."""
        fn = self.get("loss_fn")
        arity = positional_arity(fn) if callable(fn) else None
        return arity is not None and arity >= 2

    def get(self, attr: str, default: Any = None) -> Any:
        """A module-level name of the file, or ``default``."""
        return getattr(self.module, attr, default)

    def has(self, attr: str) -> bool:
        return hasattr(self.module, attr)

    # ------------------------------------------------------------------ errors
    def _nothing_found(self, found: str, expected: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path}: {found}; expected {expected}. A valid model file looks like:\n{TEMPLATE}"
        )

    def _found_names(self) -> str:
        names = [
            n
            for n in vars(self.module)
            if not n.startswith("_") and not isinstance(getattr(self.module, n), ModuleType)
        ]
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        return f"found only: {shown}" if names else "found no top-level names"

    def example_input(self, why: str) -> Any:
        if not self.has("example_input"):
            raise self._nothing_found(
                f"{why}, but the file defines no example_input",
                "example_input = a tensor or a tuple of tensors to call the model with",
            )
        return self.get("example_input")

    # ------------------------------------------------------------------ running
    def _entry(self) -> tuple[str, Any]:
        if self.name is not None:
            if not self.has(self.name):
                raise self._nothing_found(
                    f"no name {self.name!r} in the file ({self._found_names()})",
                    f"{self.name} to be a zero-argument callable or an nn.Module",
                )
            obj = self.get(self.name)
            if not isinstance(obj, torch.nn.Module) and not _zero_arg(obj):
                kind = "a callable that needs arguments" if callable(obj) else type(obj).__name__
                raise self._nothing_found(
                    f"{self.name} is {kind}",
                    f"{self.name} to be a zero-argument callable or an nn.Module",
                )
            return self.name, obj
        build = self.get("build")
        if build is not None and _zero_arg(build):
            return "build", build
        model = self.get("model")
        if isinstance(model, torch.nn.Module):
            self.example_input("found model")
            return "model", model
        if isinstance(model, type) and issubclass(model, torch.nn.Module):
            raise self._nothing_found(
                "model is the class " + model.__name__ + ", not an instance",
                f"model = {model.__name__}(...)",
            )
        raise self._nothing_found(
            f"neither a zero-argument build() nor model + example_input ({self._found_names()})",
            "a zero-argument build(), or model (an nn.Module) with example_input",
        )

    def build(self) -> tuple[torch.nn.Module | None, Any, Any]:
        """Resolve the entry point: ``(module, inputs, None)`` or ``(None, None, outputs)``."""
        label, obj = self._entry()
        if not isinstance(obj, torch.nn.Module):
            with _user_code(self.path, f"running {label}()"), torch.enable_grad():
                obj = obj()
        if isinstance(obj, torch.nn.Module):
            return obj, self.example_input(f"{label} gave an nn.Module to run"), None
        if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
            return obj[0], obj[1], None
        return None, None, obj

    def forward(self) -> Forward:
        """Build the entry point and run the forward (under ``torch.enable_grad``), recording
        module scopes (``gs.scopes``) when the file hands gradscope a module to run."""
        module, inputs, outputs = self.build()
        if module is None:
            return Forward(outputs=outputs, model=None, inputs=())
        from .scopes import scopes  # imported here: plain output files never need it

        with torch.enable_grad(), scopes(module):
            out = self.run_model(module, inputs)
        return Forward(outputs=out, model=module, inputs=_as_args(inputs)[0])

    def loss(self, output: Any, target: Any = None) -> Any:
        """Apply the file's ``loss_fn`` to ``output`` (and ``target`` when it takes two)."""
        fn = self.get("loss_fn")
        if fn is None or not callable(fn):
            raise self._nothing_found(
                "--loss was given but the file defines no loss_fn",
                "def loss_fn(output): ... returning a scalar tensor",
            )
        arity = positional_arity(fn)
        with _user_code(self.path, "running loss_fn"), torch.enable_grad():
            if arity is not None and arity >= 2:
                if target is None:
                    target = self.get("example_target")
                if target is None:
                    raise self._nothing_found(
                        "loss_fn takes (output, target) but the file has no example_target",
                        "example_target = a tensor, or def loss_fn(output)",
                    )
                return fn(output, target)
            return fn(output)


def load_model_file(spec: str | Path) -> ModelFile:
    """Import a model file ``path/to/model.py[:NAME]`` without running its ``__main__`` block.

    Raises:
        ModelFileError: the file is missing, is not Python, or raised while importing (the
            message names the file and line).
    """
    path_str, name = _split_spec(str(spec))
    path = Path(path_str)
    if not path.exists():
        raise ModelFileError(
            f"no such file: {path} (give the path of a Python model file, e.g. samples/mlp.py)"
        )
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory; give the path of a Python model file")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = "gradscope_model_" + re.sub(r"\W", "_", path.stem)
    spec_obj = importlib.util.spec_from_file_location(mod_name, path)
    if spec_obj is None or spec_obj.loader is None:
        raise ModelFileError(f"cannot import {path}: not a Python file (expected a .py model file)")
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[mod_name] = module
    try:
        with _user_code(path, "importing the model file"):
            spec_obj.loader.exec_module(module)
    except ModelFileError:
        sys.modules.pop(mod_name, None)
        raise
    return ModelFile(path, module, name)
