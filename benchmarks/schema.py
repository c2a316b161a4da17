"""Schema and deep-path benchmark (issue 20, item 3): work linear in the input.

Times, in one run on this machine:
  1. ``Graph.from_json`` of generated graph files of about ``--mb`` MB each (default 60 and 300;
     nodes like a traced MLP's: saved tensors, attributes, module paths), against ``json.loads``
     of the same text (target: at most about 2x), with the peak RSS growth of each (a
     subprocess per side, so one side's freed memory does not hide the other's);
  2. ``to_dot``, ``to_html``, ``fold``, the tree and ``to_json`` of a graph whose module path is
     ``--levels`` levels deep (default 100,000; before issue 20, 20,000 levels took 50 s and
     5.3 GiB in ``to_dot``, and ``to_html`` raised RecursionError at 1,000).

    .venv/bin/python benchmarks/schema.py [--mb 60 300] [--levels 100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradscope.graph.graph import (
    Edge,
    Graph,
    Node,
    SavedTensor,
    TensorInfo,
)


def big_graph(n_layers: int) -> Graph:
    """A graph shaped like a traced deep MLP: per layer an addmm (3 saved tensors, attributes,
    module path and classes), a relu, and a parameter's AccumulateGrad and leaf."""
    nodes = [Node("n0", "output", "output", tensor=TensorInfo("loss", [], "float32", "cpu"))]
    edges = []
    prev = "n0"
    k = 1
    for i in range(n_layers):
        addmm, relu, acc, leaf = (f"n{k}", f"n{k + 1}", f"n{k + 2}", f"n{k + 3}")
        k += 4
        path = f"layers.{i}.fc"
        classes = ("Net", "Sequential", "Block", "Linear")
        nodes.append(Node(relu, "ReluBackward0", "op", module=f"layers.{i}.act",
                          saved=[SavedTensor("result", [64, 256], "float32", "cpu", 65536,
                                             f"s{k}")], module_classes=classes))
        nodes.append(Node(addmm, "AddmmBackward0", "op", module=path,
                          attrs={"alpha": "1", "beta": "1", "mat1_sym_sizes": "(64, 256)",
                                 "mat2_sym_strides": "(1, 256)"},
                          saved=[SavedTensor("mat1", [64, 256], "float32", "cpu", 65536,
                                             f"s{k + 1}"),
                                 SavedTensor("mat2", [256, 256], "float32", "cpu", 262144,
                                             f"s{k + 2}")],
                          module_classes=classes))
        nodes.append(Node(acc, "AccumulateGrad", "accumulate", module=path))
        nodes.append(Node(leaf, f"layers.{i}.fc.weight", "leaf",
                          tensor=TensorInfo(f"layers.{i}.fc.weight", [256, 256], "float32",
                                            "cpu", f"s{k + 2}")))
        edges += [Edge(prev, relu), Edge(relu, addmm), Edge(addmm, acc, 2), Edge(acc, leaf)]
        prev = addmm
    return Graph(nodes, edges, ["n0"])


def deep_graph(depth: int) -> Graph:
    """Four nodes, two of them in a module path ``depth`` levels deep (``a.a.a...``) and one
    halfway: a file of a few hundred KiB."""
    path = ".".join(["a"] * depth)
    half = ".".join(["a"] * (depth // 2))
    classes = tuple(["Net"] + ["A"] * depth)
    nodes = [
        Node("n0", "output", "output", tensor=TensorInfo("y", [2], "float32", "cpu")),
        Node("n1", "MulBackward0", "op", module=path, module_classes=classes,
             saved=[SavedTensor("self", [2], "float32", "cpu", 8, "s0")]),
        Node("n2", "ExpBackward0", "op", module=half),
        Node("n3", "AccumulateGrad", "accumulate", module=path),
        Node("n4", "x", "leaf", tensor=TensorInfo("x", [2], "float32", "cpu")),
    ]
    edges = [Edge("n0", "n1"), Edge("n1", "n2"), Edge("n2", "n3"), Edge("n3", "n4")]
    return Graph(nodes, edges, ["n0"])


_CHILD = """
import json, resource, sys, time
from gradscope.graph.graph import Graph
text = open(sys.argv[1], encoding="utf-8").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
out = json.loads(text) if sys.argv[2] == "json" else Graph.from_json(text)
took = time.perf_counter() - t
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"s": took, "rss_mib": grew / 1024}))
"""


def _child(path: Path, what: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), what], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def bench_from_json(mb: float) -> None:
    one = len(big_graph(100).to_json()) / 100  # bytes per layer
    layers = max(1, int(mb * 1e6 / one))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.json"
        t = time.perf_counter()
        path.write_text(big_graph(layers).to_json(), encoding="utf-8")
        size = path.stat().st_size / 2**20
        took = time.perf_counter() - t
        print(f"generated {size:.0f} MiB ({layers * 4 + 1} nodes) in {took:.0f} s")
        loads = _child(path, "json")
        ours = _child(path, "graph")
    print(f"json.loads:      {loads['s']:6.2f} s  peak RSS +{loads['rss_mib']:.0f} MiB")
    print(f"Graph.from_json: {ours['s']:6.2f} s  peak RSS +{ours['rss_mib']:.0f} MiB")
    print(f"ratio from_json / json.loads: {ours['s'] / loads['s']:.2f}x (target about 2x)")


def bench_deep(levels: int) -> None:
    import gradscope as gs

    g = deep_graph(levels)
    text = g.to_json()
    print(f"module path {levels} levels deep ({len(text) / 1024:.0f} KiB of JSON)")
    for name, fn in [
        ("from_json", lambda: Graph.from_json(text)),
        ("to_json", g.to_json),
        ("to_dot", g.to_dot),
        ("to_html", g.to_html),
        ("fold", g.fold),
        ("collapse(3)", lambda: g.collapse(3)),
        ("tree", lambda: gs.render_tree(g)),
    ]:
        t = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a figure to report, before the fix
            print(f"  {name:12s} {type(exc).__name__}: {str(exc)[:60]}")
            continue
        print(f"  {name:12s} {time.perf_counter() - t:6.2f} s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="*", default=[60.0, 300.0],
                    help="file sizes to time, in one run (0 or none: skip)")
    ap.add_argument("--levels", type=int, default=100_000)
    args = ap.parse_args()
    if args.levels:
        bench_deep(args.levels)
    for mb in args.mb:
        if mb:
            bench_from_json(mb)


if __name__ == "__main__":
    main()
