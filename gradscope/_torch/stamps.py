"""What gradscope writes into live autograd nodes, and the one way it follows them.

Recorders that run during a forward (``gs.scopes``, ``gs.record_forward``, ``gs.leak_check``)
stamp each new node's ``grad_fn.metadata`` dict under the keys below; ``gs.trace`` and
``gs.record_backward`` read them back into typed fields of the model. The keys are namespaced
(``gradscope.*``) so they never collide with torch's own (``traceback_`` of anomaly mode).

``user_frame`` finds the user's line in a stack (the innermost frame outside torch and
gradscope). ``walk_nodes`` is the iterative walk over ``next_functions`` that every place
outside the hot ``trace`` walk uses (scopes stamping, forward-line stamping, shared-slot
detection): no recursion, each node once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

import torch

#: The module path (``encoder.layers.3.self_attn``) whose forward created the node.
MODULE_KEY = "gradscope.module"
#: The class names along that path, one per depth level, joined by "/".
MODULE_CLASSES_KEY = "gradscope.module_classes"
#: ``(filename, lineno)`` of the user's line that created the node, or None.
CREATED_KEY = "gradscope.created_at"
#: ``nan``/``inf``: ``record_forward(check_finite=True)`` found this node's output to be the
#: first non-finite value of the forward.
FORWARD_NONFINITE_KEY = "gradscope.forward_nonfinite"
#: The step token of ``leak_check`` (dies with the last node of its step).
LEAK_KEY = "gradscope.leak_step"

#: ``_sequence_nr()`` of AccumulateGrad nodes (not created by a forward): UINT64_MAX.
NO_SEQUENCE_NR = 2**64 - 1

#: The gradscope package's folder: code there is gradscope's own, never the user's line (the
#: CLI's model-file loader, and the hooks, call torch from there).
OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


#: code objects of gradscope's own torch-function-mode dispatch (``scopes``' hook mode): a frame
#: running one of them only passes a torch call on, so the user's line is further out
PASS_THROUGH: set[Any] = set()


def outside_gradscope(frame: FrameType | None) -> FrameType | None:
    """``frame``, or the nearest of its callers whose code is not in the gradscope package;
    None when every frame out to the bottom of the stack is gradscope's."""
    while frame is not None and frame.f_code.co_filename.startswith(OWN_DIR):
        frame = frame.f_back
    return frame


#: torch's own folder: its frames are never the user's line
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_INTERNAL: dict[str, bool] = {}  # by file name: hashing a code object hashes its bytecode
#: ``torch_internal``'s answers so far, by file name, for a walk over many frames to read
#: without a call per frame (a name not in it yet: ask ``torch_internal``)
INTERNAL_FILES: dict[str, bool] = _INTERNAL


def torch_internal(filename: str) -> bool:
    """Is ``filename`` torch's own code (or frozen importlib), never the user's line?"""
    hit = _INTERNAL.get(filename)
    if hit is None:
        hit = filename.startswith((_TORCH_DIR, "<frozen"))
        _INTERNAL[filename] = hit
    return hit


def user_frame(frame: Any) -> Any:
    """The innermost frame outside torch: the user's line. None when torch code was called by
    gradscope itself (the CLI running an ``nn.Linear`` from a model file): no line of the
    user's made that node, and the line that called gradscope would only mislead."""
    while frame is not None and (
        torch_internal(frame.f_code.co_filename) or frame.f_code in PASS_THROUGH
    ):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(OWN_DIR):
        return None
    return frame


#: how far above a grad-disabled torch call a custom Function's forward is looked for
CUSTOM_DEPTH = 8


def custom_apply(frame: Any) -> tuple[Any, Any] | None:
    """Inside a custom Function's forward (a torch call with grad disabled, at ``frame``):
    ``(ctx, apply_frame)``, its node and the user's frame that called ``.apply`` (None when
    only gradscope or torch called it); None when ``frame`` is not inside such a forward.

    The forward's frame is the nearest one (a few frames up: the forward may call helpers)
    whose first argument is a Function's ``ctx`` and whose code is that Function's
    ``forward``; the user's line is the first frame outside torch above it
    (``Function.apply`` is a Python frame in between up to torch 2.13, a builtin without a
    frame from 2.14)."""
    from . import torchcompat

    for _ in range(CUSTOM_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_argcount and not torch_internal(code.co_filename):
            ctx = frame.f_locals.get(code.co_varnames[0])
            if torchcompat.is_custom_ctx(ctx) and torchcompat.custom_forward_code(ctx) is code:
                return ctx, user_frame(frame.f_back)
        frame = frame.f_back
    return None


def walk_nodes(
    starts: Iterable[Any], *, enter: Callable[[Any], bool] | None = None
) -> Iterator[Any]:
    """Every autograd node reachable from ``starts`` over ``next_functions``, once each.

    Iterative (an explicit stack), depth first. ``enter(fn)`` decides whether the walk goes on
    below ``fn`` (it is still yielded); by default it always does. ``None`` entries (inputs that
    need no gradient) are skipped.

    Example:
        >>> import torch
        >>> x = torch.ones(2, requires_grad=True)
        >>> [type(fn).__name__ for fn in walk_nodes([(x * 2).sum().grad_fn])]
        ['SumBackward0', 'MulBackward0', 'AccumulateGrad']
    """
    seen: set[Any] = set()
    stack = [fn for fn in starts if fn is not None]
    stack.reverse()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        yield fn
        if enter is not None and not enter(fn):
            continue
        nxt = [n for n, _ in fn.next_functions if n is not None and n not in seen]
        nxt.reverse()
        stack.extend(nxt)
