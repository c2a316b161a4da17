"""The monitor's state has owners: no module of the monitor package imports ``core``, no code
writes another object's private attribute, and a parameter inserted in the middle of the model
while it trains never mislabels a step (each name's norm checked against ``p.grad.norm()``)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from torch import nn

import gradscope as gs

MONITOR = ROOT / "gradscope" / "capture" / "monitor"


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
            out.update(f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_module_of_the_monitor_imports_core() -> None:
    for path in sorted(MONITOR.glob("*.py")):
        if path.name in ("core.py", "__init__.py"):
            continue
        names = _imported(path)
        assert not any(n in (".core", "..core") or n.endswith("monitor.core") for n in names), (
            f"{path.name} imports core"
        )


def private_writes(path: Path) -> list[str]:
    """``line: target`` of every assignment, augmented assignment or ``del`` of a private
    attribute (``x._name``) on anything but ``self``/``cls``, and of ``setattr(x, "_name", ...)``.
    Attributes named ``_gradscope*`` (gradscope's own marks on torch objects) are not
    another class's state."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "setattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")
        ):
            found.append(f"{node.lineno}: setattr(..., {node.args[1].value!r})")
        for target in targets:
            for sub in ast.walk(target):
                if not (isinstance(sub, ast.Attribute) and sub.attr.startswith("_")):
                    continue
                if sub.attr.startswith(("__", "_gradscope")):
                    continue
                if isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                    continue
                found.append(f"{node.lineno}: {ast.unparse(sub)}")
    return found


def test_no_private_attribute_written_outside_its_class() -> None:
    problems = []
    for path in sorted((ROOT / "gradscope").rglob("*.py")):
        problems.extend(f"{path.relative_to(ROOT)}:{w}" for w in private_writes(path))
    assert not problems, "\n".join(problems)


def test_the_write_scan_finds_each_kind(tmp_path) -> None:
    f = tmp_path / "x.py"
    f.write_text(
        "def f(mon, p):\n"
        "    mon._dp_probe = False\n"
        "    mon._seen += 1\n"
        "    del mon._stream\n"
        "    setattr(mon, '_point', 'optimizer')\n"
        "    p._gradscope_mark = 1\n"  # gradscope's own mark: fine
        "class A:\n"
        "    def g(self):\n"
        "        self._x = 1\n"  # its own: fine
    )
    assert [w.split(":")[0] for w in private_writes(f)] == ["2", "3", "4", "5"]


# ---------------------------------------------------------------- an inserted parameter
class Block(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        gain = getattr(self, "gain", None)  # a parameter added while training
        return torch.tanh(y * gain if gain is not None else y)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block(5)
        self.b = Block(5)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


@pytest.mark.parametrize("use_opt", [False, True])
def test_a_parameter_inserted_mid_model_never_mislabels_a_step(use_opt: bool) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = gs.GradMonitor(model, optimizer=opt if use_opt else None)
    truth = []
    inserted_at = 2
    for step in range(5):
        if step == inserted_at:  # between a.fc and b.fc in named_parameters() order
            model.b.gain = nn.Parameter(torch.full((5,), 1.5))
            opt.add_param_group({"params": [model.b.gain]})
        opt.zero_grad()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", gs.MonitorWarning)  # "watching ... from step 3"
            model(torch.randn(16, 5)).square().mean().backward()
            truth.append({n: p.grad.norm().item() for n, p in model.named_parameters()
                          if p.grad is not None})
            if use_opt:
                opt.step()
        said = [str(w.message) for w in caught]
        assert said == ([] if step != inserted_at else [
            "GradMonitor: the model's parameters changed after it started (added: b.gain); "
            "watching the model's current ones from step 3 on"
        ])
    mon.remove()
    assert [st.step for st in mon.history] == list(range(5))
    assert list(truth[inserted_at]) == [
        "a.fc.weight", "a.fc.bias", "b.gain", "b.fc.weight", "b.fc.bias", "head.weight",
        "head.bias",
    ]
    for st, want in zip(mon.history, truth, strict=True):
        for name, ps in st.params.items():  # every name the step reports: its own norm
            assert ps.norm == pytest.approx(want[name], rel=1e-6, abs=0), (st.step, name)
        # the step of the insertion is measured with the parameters watched when it began;
        # every later one watches the new parameter too
        expected = set(want) - ({"b.gain"} if st.step <= inserted_at else set())
        assert set(st.params) == expected, st.step
