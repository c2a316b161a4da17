"""What the integrations share: checking the monitor options a callback is given."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ..errors import MonitorError

#: set by the callback from the framework's loop, never by the user
_SUPPLIED = ("model", "optimizer", "scaler")


def check_options(framework: str, options: dict[str, Any]) -> dict[str, Any]:
    """Refuse options that ``GradMonitor`` does not take, or that the framework supplies."""
    from ..monitor.core import GradMonitor

    known = [
        name
        for name, p in inspect.signature(GradMonitor.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for name in options:
        if name in _SUPPLIED:
            raise MonitorError(
                f"GradscopeCallback({name}=...) is not needed: the {framework} loop supplies "
                f"the {name}; pass only monitor options ({', '.join(known)})"
            )
        if name not in known:
            raise MonitorError(
                f"GradscopeCallback got an unknown option {name!r}; it takes GradMonitor's "
                f"options: {', '.join(n for n in known if n not in _SUPPLIED)}"
            )
    return dict(options)


def alert_lines(alerts: list[Any], start: int, incidents: Sequence[Any] = ()) -> list[str]:
    """One log line per alert from index ``start`` on (naming its step's incident's origin)."""
    from ..monitor.incident import alert_line

    return [f"gradscope {a.kind}: {alert_line(a, list(incidents))}" for a in alerts[start:]]


def incident_lines(incidents: list[Any], start: int) -> list[str]:
    """One log message per incident from index ``start`` on (its 2-4 summary lines)."""
    return [f"gradscope incident: {inc.summary()}" for inc in incidents[start:]]


class AlertRelay:
    """Passes a monitor's new alerts and incidents to a framework's logger, each once, as a
    warning."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.told = 0
        self.told_incidents = 0

    def reset(self) -> None:
        """A fresh monitor: nothing told yet."""
        self.told = 0
        self.told_incidents = 0

    def tell(self, monitor: Any) -> None:
        """Log the incidents and alerts ``monitor`` recorded since the last call (an
        incident first: it says where the alert's NaN came from)."""
        if monitor is None:
            return
        incidents = monitor.incidents
        if len(incidents) != self.told_incidents:
            for line in incident_lines(incidents, self.told_incidents):
                self.logger.warning(line)
            self.told_incidents = len(incidents)
        if len(monitor.alerts) == self.told:
            return
        for line in alert_lines(monitor.alerts, self.told, incidents):
            self.logger.warning(line)
        self.told = len(monitor.alerts)

    def close(self, monitor: Any) -> None:
        """Log what is left and remove the monitor's hooks (its history stays)."""
        if monitor is not None:
            self.tell(monitor)
            monitor.remove()
