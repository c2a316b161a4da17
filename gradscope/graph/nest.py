"""Find the tensors in whatever a model returned: a tensor, or a nest of tuples, lists, dicts,
dataclasses, namedtuples and Hugging Face ``ModelOutput``s. Other values are skipped."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch


def iter_tensors(obj: Any, root: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for every tensor in ``obj``, depth first, in container order.

    Iterative (a stack, no recursion) and cycle-safe, so arbitrarily deep nests work. Paths read
    like Python: ``output``, ``output[0]``, ``output['logits']``, ``output.hidden``.
    """
    stack: list[tuple[str, Any]] = [(root, obj)]
    on_path: set[int] = set()
    while stack:
        path, item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield path, item
            continue
        if id(item) in on_path:
            continue
        children = list(_children(path, item))
        if children:
            on_path.add(id(item))
            stack.extend(reversed(children))


def _children(path: str, item: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(item, Mapping):  # dict, OrderedDict, transformers.ModelOutput
        for k, v in item.items():
            yield f"{path}[{k!r}]", v
    elif isinstance(item, tuple) and hasattr(item, "_fields"):  # namedtuple
        for k, v in zip(item._fields, item):
            yield f"{path}.{k}", v
    elif isinstance(item, (tuple, list)):
        for i, v in enumerate(item):
            yield f"{path}[{i}]", v
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        for f in dataclasses.fields(item):
            yield f"{path}.{f.name}", getattr(item, f.name, None)


def device_of(model: Any, inputs: Any = ()) -> Any:
    """The device a model runs on: its first parameter's, else its inputs' first tensor's,
    else the CPU.

    Example:
        >>> device_of(torch.nn.Linear(2, 2)).type
        'cpu'
    """
    for p in model.parameters():
        return p.device
    for _, t in iter_tensors(inputs):
        return t.device
    return torch.device("cpu")
