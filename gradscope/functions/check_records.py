"""What ``gs.check`` found, as plain data: the worst mismatching element of each Jacobian
block, the blocks themselves, and the verdict per derivative order.

Jacobians follow gradcheck's layout: rows are elements of an input, columns elements of an
output, so ``CheckFailure.index == (input_element, output_element)``, flat (row-major) indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..output.formats import Shown

ORDER_NAME = {1: "gradcheck (first derivatives)", 2: "gradgradcheck (second derivatives)"}


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major index of element ``flat`` in a tensor of ``shape``.

    Example:
        >>> unravel(7, (4, 3)), unravel(0, ())
        ((2, 1), ())
    """
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """The worst mismatching element of one (order, input, output) Jacobian block.

    Attributes:
        order: 1 for gradcheck, 2 for gradgradcheck.
        input_index: position of the input in ``inputs`` (order 2: inputs, then grad_outputs).
        output_index: position of the output in what ``fn`` returned (order 2: the input whose
            gradient it is).
        index: ``(input_element, output_element)``, flat indices into that input and output.
        numerical: the finite-difference Jacobian entry.
        analytical: the entry computed by backward.
        diff: ``abs(analytical - numerical)``.
    """

    order: int
    input_index: int
    output_index: int
    index: tuple[int, int]
    numerical: float
    analytical: float
    diff: float


@dataclass(slots=True)
class JacobianBlock:
    """Numerical and analytical Jacobian of one output with respect to one input.

    ``numerical[r][c]`` is d output[c] / d input[r] (flat indices); ``mismatches`` lists the
    ``(r, c)`` entries outside ``atol + rtol * |numerical|``.
    """

    order: int
    input_index: int
    output_index: int
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    numerical: list[list[float]]
    analytical: list[list[float]]
    mismatches: list[tuple[int, int]] = field(default_factory=list)

    def element(self, index: tuple[int, int]) -> str:
        """The entry ``(r, c)`` as the input's and the output's own indices:
        ``in[2, 1] / out[1]`` for row 7 of a (4, 3) input and column 1 of a (2,) output."""
        r, c = index
        return f"in{list(unravel(r, self.input_shape))} / out{list(unravel(c, self.output_shape))}"

    def worst(self) -> CheckFailure | None:
        """The mismatching entry with the largest absolute difference, or None."""
        if not self.mismatches:
            return None
        def gap(rc: tuple[int, int]) -> float:
            return abs(self.analytical[rc[0]][rc[1]] - self.numerical[rc[0]][rc[1]])

        r, c = max(self.mismatches, key=gap)
        n, a = self.numerical[r][c], self.analytical[r][c]
        return CheckFailure(
            self.order, self.input_index, self.output_index, (r, c), n, a, abs(a - n)
        )


@dataclass
class CheckResult(Shown):
    """What ``gs.check`` found. Render it with rich (``console.print(result)``).

    Attributes:
        name: what was checked (the Function's class name or the function's name).
        ok: True when every requested gradcheck/gradgradcheck passed.
        failures: the worst element of each failing Jacobian block.
        notes: things worth knowing (inputs cast to float64, checks that could not run...).
        orders: the derivative orders checked (``(1,)`` or ``(1, 2)``).
        passed: order -> whether torch's check of that order passed.
        messages: order -> torch's own message, for the orders that failed.
        jacobians: the Jacobian blocks computed (small ones, or those of a failing order).
    """

    VIEW = "check"

    name: str
    ok: bool
    failures: list[CheckFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    orders: tuple[int, ...] = (1,)
    passed: dict[int, bool] = field(default_factory=dict)
    messages: dict[int, str] = field(default_factory=dict)
    jacobians: list[JacobianBlock] = field(default_factory=list)

    def summary(self) -> str:
        """One line: passed, or which orders failed and where the worst element is."""
        done = " and ".join(ORDER_NAME[o].split(" ")[0] for o in self.orders)
        if self.ok:
            return f"{self.name}: passed {done}"
        parts = []
        for f in self.failures:
            parts.append(
                f"order {f.order}: input {f.input_index}, output {f.output_index}, element "
                f"{self.where(f)}: numerical {f.numerical:.6g} vs analytical {f.analytical:.6g}"
            )
        failed = [o for o in self.orders if not self.passed.get(o, True)]
        what = ", ".join(ORDER_NAME[o].split(" ")[0] for o in failed)
        worst = f"; worst {parts[0]}" if parts else ""
        more = f" (+{len(parts) - 1} more)" if len(parts) > 1 else ""
        return f"{self.name}: FAILED {what}{worst}{more}"

    def block(self, f: CheckFailure) -> JacobianBlock | None:
        """The Jacobian block a failure was found in (None when it was not kept)."""
        return next((b for b in self.jacobians if (b.order, b.input_index, b.output_index)
                     == (f.order, f.input_index, f.output_index)), None)

    def where(self, f: CheckFailure) -> str:
        """The failing element in the input's and output's own indices (``in[2, 1] /
        out[0]``), or the flat ``(input_element, output_element)`` when its block is gone."""
        block = self.block(f)
        return block.element(f.index) if block is not None else f"({f.index[0]}, {f.index[1]})"

