"""Course: custom torch.autograd.Function, checked with gradcheck.

ClippedReLU saves its input with ctx.save_for_backward and keeps the non-tensor clip_val on
ctx; in the graph it is a node of its own, ClippedReLUBackward, holding that saved tensor.
gs.check runs torch's gradcheck and gradgradcheck on it, and on the wrong twin whose backward
forgets the mask: the report names the input, the output and the worst element, which lies
where the output is clipped (x <= 0 or x >= clip_val), and shows both Jacobians.

    python samples/course/custom_function.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from rich.console import Console

import gradscope as gs


def load_functions():
    """samples/functions.py, loaded by path (samples/ is not a package)."""
    name = "gradscope_course_functions"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "functions.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def main() -> dict[str, object]:
    out = Console(width=110, highlight=False)
    F = load_functions()
    x, clip = F.ClippedReLU_inputs()
    y = F.ClippedReLU.apply(x, clip)
    graph = gs.trace(y.mean(), params={"x": x})
    out.print(gs.render_tree(graph))
    node = next(n for n in graph.nodes if n.kind == "custom")
    out.print(f"custom node {node.name}: saved {[s.name for s in node.saved]}, attrs {node.attrs}")

    good = gs.check(F.ClippedReLU, x, clip)
    bad = gs.check(F.WrongClippedReLU, x, clip)
    out.print(good)
    out.print(bad)
    worst = bad.failures[0]
    value = x.detach().reshape(-1)[worst.index[0]].item()
    out.print(f"worst element: x = {value:+.2f}, outside (0, {clip}): the mask was forgotten there")
    return {"graph": graph, "good": good, "bad": bad, "x": x.detach(), "clip": clip}


if __name__ == "__main__":
    main()
