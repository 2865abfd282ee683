"""Feature checks that only a run can settle. The startup probe (``EngineProcess.verify_features``)
verifies what a few requests show; a batching limit shows only under more load than the limit:
the engine's running-requests gauge must never exceed ``max_num_seqs``, and the check is
verified only when the run offered more (requests waited, or more were in flight)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.bus import Bus, Sample
from engine_adapters.base import feature_check_line, feature_status
from engine_adapters.config import Features


class RunEffects:
    """Watches the engine's telemetry during a run (peak running and waiting requests) and then
    completes the feature checks with it. ``close`` when the run ends."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._sub = bus.subscribe(kinds=[Sample], sources=["engine"])
        self.peak_running: float | None = None
        self.peak_waiting: float | None = None

    def _drain(self) -> None:
        for item in self._sub.drain():
            if not isinstance(item, Sample):
                continue
            running, waiting = item.values.get("requests_running"), item.values.get("requests_waiting")
            if running is not None:
                self.peak_running = max(running, self.peak_running or 0.0)
            if waiting is not None:
                self.peak_waiting = max(waiting, self.peak_waiting or 0.0)

    def close(self) -> None:
        self._bus.unsubscribe(self._sub)

    def refine(self, checks: Sequence[dict[str, Any]], features: Features, peak_in_flight: int,
               note: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """``checks`` (dict form) with what the run showed; each changed check is noted."""
        self._drain()
        out = []
        for check in checks:
            new = check
            if check.get("key") == "max_num_seqs" and features.max_num_seqs is not None:
                new = batching_check(check, features.max_num_seqs, self.peak_running, self.peak_waiting, peak_in_flight)
            if new is not check and note is not None:
                note(feature_check_line(new))
            out.append(new)
        return out


def batching_check(check: dict[str, Any], limit: int, peak_running: float | None, peak_waiting: float | None,
                   peak_in_flight: int) -> dict[str, Any]:
    """The ``max_num_seqs`` check after a run: NOT ACTIVE if more requests ran at once than the
    limit; verified if the run offered more than the limit and the engine held to it."""
    if feature_status(check) != "accepted" or peak_running is None:
        return check  # not echoed (already NOT ACTIVE), or no engine telemetry to judge by
    if peak_running > limit:
        status, evidence = "not active", f"the engine ran {peak_running:.0f} requests at once, over max_num_seqs={limit}"
    elif (peak_waiting or 0) > 0 or peak_in_flight > limit:
        status = "verified"
        evidence = (f"at most {peak_running:.0f} requests ran at once (limit {limit}) while "
                    + (f"up to {peak_waiting:.0f} waited" if peak_waiting else f"{peak_in_flight} were in flight"))
    else:
        return check  # the run never offered more than the limit: nothing to see
    return {**check, "status": status, "evidence": evidence}

