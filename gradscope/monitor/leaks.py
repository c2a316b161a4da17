"""``leaks=True``: the monitor's watch for autograd graphs of earlier steps still alive.

``LeakWatch`` owns the ``gs.leak_check`` behind it (saved-tensor hooks, installed only when
asked for) and which leaking steps were already said: at each step boundary ``step`` returns
one ``Alert`` of kind ``leak`` per earlier step whose graph is newly found alive.
"""

from __future__ import annotations

from typing import Any

from .log import Alert


class LeakWatch:
    """The leak check of a monitor (``leaks=True``), one alert per leaking step."""

    def __init__(self) -> None:
        from ..memory.saved import LeakCheck  # saved-tensor hooks: only when asked for

        self._check: Any = LeakCheck(grace=1, warn=False).start()
        self._alerted: set[int] = set()

    def step(self, step: int) -> list[Alert]:
        """Step ``step`` is over: the alerts for graphs of earlier steps newly found alive."""
        out = []
        for leak in self._check.step().leaks:
            if leak.step not in self._alerted:
                self._alerted.add(leak.step)
                out.append(Alert("leak", step, f"step {leak.step}", str(leak)))
        return out

    def remove(self) -> None:
        """The saved-tensor hooks off (safe twice)."""
        self._check.remove()
