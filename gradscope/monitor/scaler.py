"""The ``GradScaler`` of a mixed-precision loop, as a step boundary.

A scaler that finds non-finite gradients skips ``optimizer.step()``: no optimizer hook runs,
and the step ends at ``scaler.update()``. ``ScalerHook`` shadows the scaler instance's
``update`` (never the class's) and tells the monitor, through ``on_skipped``, when an update
followed no ``optimizer.step()`` (told by ``stepped``). Once undone it only calls through:
another monitor's wrapper may have wrapped it since; that one stays, and this one records
nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ScalerHook:
    """``scaler.update`` shadowed: ``on_skipped()`` runs (through ``guard``) when the update
    ends a step whose ``optimizer.step()`` the scaler skipped."""

    def __init__(
        self, scaler: Any, on_skipped: Callable[[], None], guard: Callable[..., Any]
    ) -> None:
        self._scaler = scaler
        self._on_skipped = on_skipped
        self._guard = guard
        self._stepped = False

    def stepped(self) -> None:
        """``optimizer.step()`` ran (its post-hook)."""
        self._stepped = True

    def _updated(self) -> None:
        stepped, self._stepped = self._stepped, False
        if not stepped:  # the scaler found non-finite gradients and did not call step()
            self._on_skipped()

    def install(self) -> Callable[[], None]:
        """Shadow the instance's ``update``; returns what undoes it."""
        scaler, original = self._scaler, self._scaler.update
        active = [True]

        def update(new_scale: Any = None) -> None:
            if active[0]:
                self._guard(self._updated)
            original(new_scale)

        scaler.update = update

        def unwrap() -> None:
            active[0] = False
            if scaler.__dict__.get("update") is update:
                del scaler.__dict__["update"]

        return unwrap
