"""Feature checks that only a run can settle. The startup probe (``EngineProcess.verify_features``)
verifies what a few requests show; a batching limit shows only under more load than the limit:
the engine's running-requests gauge must never exceed ``max_num_seqs``, and the check is
verified only when the run offered more (requests waited, or more were in flight). A reasoning
parser shows only in the replies: reasoning deltas seen, or not."""

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
               note: Callable[[str], None] | None = None, *, replies: Replies | None = None) -> list[dict[str, Any]]:
        """``checks`` (dict form) with what the run showed; each changed check is noted."""
        self._drain()
        checks = list(checks)
        if features.reasoning_parser is not None and not any(c.get("key") == "reasoning_parser" for c in checks):
            checks.append({"key": "reasoning_parser", "requested": features.reasoning_parser, "status": "accepted",
                           "evidence": "flag passed"})  # an engine that does not echo its arguments
        out = []
        for check in checks:
            new = check
            if check.get("key") == "max_num_seqs" and features.max_num_seqs is not None:
                new = batching_check(check, features.max_num_seqs, self.peak_running, self.peak_waiting, peak_in_flight)
            if check.get("key") == "reasoning_parser" and features.reasoning_parser is not None and replies is not None:
                new = reasoning_check(check, features.reasoning_parser, replies)
            if new is not check and note is not None:
                note(feature_check_line(new))
            out.append(new)
        return out


Replies = tuple[str, int, int]
"""What a run's replies showed a reasoning parser: (the API, completed requests, reasoning tokens)."""


def reasoning_check(check: dict[str, Any], parser: str, replies: Replies) -> dict[str, Any]:
    """The reasoning parser's check after a run: verified when replies carried reasoning deltas,
    NOT ACTIVE when chat replies came back without any (the model does not think, or the parser
    does not know its markers). Completions carry no reasoning, so they judge nothing."""
    api, completed, reasoning_tokens = replies
    if feature_status(check) == "not active" or completed == 0:
        return check
    if api != "chat":
        return {**check, "evidence": f"{check.get('evidence', '')}; not judged by the replies: the workload "
                                     "sends completions, which carry no reasoning (workload.api = \"chat\")"}
    if reasoning_tokens > 0:
        return {**check, "status": "verified",
                "evidence": f"reasoning deltas seen: {reasoning_tokens:,} reasoning tokens in {completed:,} replies"}
    return {**check, "status": "not active",
            "evidence": f"no reasoning delta in {completed:,} chat replies: the model did not think, or the "
                        f"parser '{parser}' does not know its markers"}


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

