"""A run as the workbench shows it while it runs, folded from the bus's events without Qt.

The GUI drains its bus subscription into :meth:`LiveRun.fold` (each event through
:meth:`LiveRun.apply`) and draws from the state here: the engine's phase, the level running and
its progress, the finished levels and the figures they flagged, each telemetry source's support,
notices, the tail of the log and how the run ended. Each event kind has its own typed callback
list, so a widget subscribes to what it draws and a test drives the whole fold headless.

Also here, in words: what a run loads and which features it turns on (the presentation's
heading), and the line that sums up a finished run (the banner's).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from app import events
from app.analysis import metric_catalog as catalog
from app.analysis.compare import NODE_TAG
from app.config import RunConfig
from app.labels import features_on
from app.listeners import Listeners
from app.planner.live import limit_figures
from app.planner.plan import Plan

if TYPE_CHECKING:
    from app.runner import RunResult

LIVE_SOURCES = (events.CLIENT_SOURCE, "engine")
"""Sources whose latest values the tiles read (the client's rolling figures, the engine's own)."""
LIVE_KINDS = (events.Sample, events.RunStarted, events.PhaseChanged, events.LogLine, events.EngineReady,
              events.LevelStarted, events.Progress, events.LevelFinished, events.QualityMeasured,
              events.RunFinished, events.TelemetrySupport, events.Notice)
"""What a live run folds, and so what the window's bus subscription takes: request records are
the store's business, campaigns the campaign tabs'."""
LOG_TAIL_LINES = 2000
"""Log lines kept here (the log view keeps its own, filterable, history)."""


class LiveRun:
    """The running run, as the events so far say. :meth:`begin` starts a run the window launched
    (its configuration and the plan it is measured against come from there, not the bus); what
    the telemetry says of this machine (``support``, ``has_gpu``) outlives runs."""

    def __init__(self) -> None:
        self.support: dict[str, events.TelemetrySupport] = {}
        self.has_gpu = False
        """This machine has a GPU (the window's probe said so, or a GPU source reported): the GPU
        plots and tiles apply."""
        self.started: Listeners[events.RunStarted] = Listeners()
        self.phase_changed: Listeners[events.PhaseChanged] = Listeners()
        self.engine_ready: Listeners[events.EngineReady] = Listeners()
        self.level_started: Listeners[events.LevelStarted] = Listeners()
        self.progressed: Listeners[events.Progress] = Listeners()
        self.level_finished: Listeners[events.LevelFinished] = Listeners()
        self.support_changed: Listeners[events.TelemetrySupport | None] = Listeners()
        self.noticed: Listeners[events.Notice] = Listeners()
        self.quality_measured: Listeners[events.QualityMeasured] = Listeners()
        self.finished: Listeners[events.RunFinished] = Listeners()
        self.logged: Listeners[list[str]] = Listeners()
        self.config: RunConfig | None = None
        self.plan: Plan | None = None
        self.clear()

    def begin(self, config: RunConfig | None) -> None:
        """A run launched from the window with this configuration (None: a campaign's runs)."""
        self.clear()
        self.config, self.plan = config, None

    def clear(self) -> None:
        """Forget the last run's figures (a new profile, a new run)."""
        self.run: events.RunStarted | None = None
        self.phase: events.PhaseChanged | None = None
        self.ready: events.EngineReady | None = None
        self.level: events.LevelStarted | None = None
        self.progress: events.Progress | None = None
        self.levels: list[events.LevelFinished] = []
        self.flagged: dict[str, str] = {}
        """Client figures a finished level found unreliable (name -> why): the engine's stand in."""
        self.level_started_wall_s: dict[int, float] = {}
        self.notices: list[str] = []
        self.log_tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.outcome: events.RunFinished | None = None
        self.quality: events.QualityMeasured | None = None
        """The quality probe's figures, once it ended (after the last level)."""
        self.nodes: dict[str, str] = {}
        """Run id -> the cluster node it runs on (its ``node:`` tag): the trials of a campaign on a
        cluster run side by side, and each one's lines say where they come from."""
        self.latest: dict[tuple[str, str], float] = {}
        """The last value of each (source, value name) of :data:`LIVE_SOURCES`: the tiles'."""

    # -- folding -----------------------------------------------------------------------------

    def fold(self, items: Iterable[events.Item]) -> list[events.Sample]:
        """Apply what one drain of the bus brought; returns the samples to plot (the client's
        progress among them, as the ``client`` series). The plots start with the load: samples
        from before the engine was ready in the same drain are left out."""
        items = list(items)
        samples: list[events.Sample] = []
        for item in items:
            if isinstance(item, events.Sample):
                samples.append(item)
            elif isinstance(item.payload, events.Progress):
                samples.append(item.payload.sample(item.t_mono, item.t_wall))
        lines: list[str] = []
        for item in items:
            if not isinstance(item, events.Event):
                continue
            if isinstance(item.payload, events.LogLine):
                lines.append(self.on_node(item.payload.run_id, item.payload.line))  # one batch per drain
                continue
            if isinstance(item.payload, events.EngineReady):
                samples = [s for s in samples if s.t_mono >= item.t_mono]
            self.apply(item)
        for sample in samples:
            if sample.source in LIVE_SOURCES:
                for name, value in sample.values.items():
                    self.latest[(sample.source, name)] = float(value)
            if sample.source.startswith("gpu") and not self.has_gpu:
                self.has_gpu = True
                self.support_changed.emit(None)
        if lines:
            self._log(lines)
        return samples

    def apply(self, event: events.Event) -> None:
        """Fold one event into the state, then tell that kind's subscribers."""
        match event.payload:
            case events.RunStarted() as started:
                self.run, self.outcome = started, None
                node = node_of(started.tags)
                if node is not None:
                    self.nodes[started.run_id] = node
                self.started.emit(started)
            case events.PhaseChanged() as phase:
                self.phase = phase
                self.phase_changed.emit(phase)
            case events.LogLine() as log:
                self._log([self.on_node(log.run_id, log.line)])
            case events.EngineReady() as ready:
                self.ready = ready
                self.level_started_wall_s.clear()
                self.engine_ready.emit(ready)
            case events.LevelStarted() as level:
                self.level, self.progress = level, None
                self.level_started_wall_s[level.index] = level.started_wall_s
                self.level_started.emit(level)
            case events.Progress() as progress:
                self.progress = progress
                self.progressed.emit(progress)
            case events.LevelFinished() as finished:
                self.levels.append(finished)
                self.flagged.update(finished.summary.unreliable())
                self.level_finished.emit(finished)
            case events.TelemetrySupport() as support:
                self.support[support.source] = support
                if support.source.startswith("gpu") and support.available:
                    self.has_gpu = True
                self.support_changed.emit(support)
            case events.Notice() as notice:
                self.notices.append(notice.message)
                self.noticed.emit(notice)
            case events.QualityMeasured() as quality:
                self.quality = quality
                self.quality_measured.emit(quality)
            case events.RunFinished() as outcome:
                self.outcome = outcome
                self.finished.emit(outcome)
            case events.RequestDone() | events.RequestsDone() | events.CampaignUpdated():
                pass  # the store keeps requests; the campaign tabs draw campaigns

    def on_node(self, run_id: str | None, text: str) -> str:
        """``text`` of the run ``run_id``, prefixed with its node when it runs on a cluster."""
        node = self.nodes.get(run_id) if run_id is not None else None
        return f"[{node}] {text}" if node is not None else text

    def _log(self, lines: list[str]) -> None:
        self.log_tail.extend(lines)
        self.logged.emit(lines)

    # -- what it says -------------------------------------------------------------------------

    def steady_window_s(self, finished: events.LevelFinished,
                        t0_wall_s: float | None) -> tuple[float, float] | None:
        """A finished level's steady window in seconds from ``t0_wall_s`` (the plots' first
        sample; the level counts from its own start, so the wall clock places it)."""
        started = self.level_started_wall_s.get(finished.index)
        steady = finished.summary.steady
        if steady is None or started is None or t0_wall_s is None:
            return None
        return started + steady.start_s - t0_wall_s, started + steady.end_s - t0_wall_s


def node_of(tags: Iterable[str]) -> str | None:
    """The cluster node a run ran on, from its tags (None: this machine)."""
    return next((t.removeprefix(NODE_TAG) for t in tags if t.startswith(NODE_TAG)), None)


def load_text(config: RunConfig) -> str:
    """The model and the load in one line: the presentation's subtitle."""
    load = config.load
    if load.pattern.closed_loop:
        how = f"{load.concurrency:,} concurrent"
    elif load.pattern.takes_levels:
        how = f"sweep of {load.sweep_of} " + ", ".join(f"{v:g}" for v in load.levels)
    else:
        how = f"{load.pattern} at {load.rate_rps:g} req/s" if load.rate_rps else load.pattern
    return (f"{config.engine.model} \u00b7 {how} \u00b7 {config.workload.input_len.mean:,} in / "
            f"{config.workload.output_len.mean:,} out tokens")


def features_text(config: RunConfig) -> str:
    on = features_on(config.features.model_dump(mode="json"))
    return "Features: " + (" \u00b7 ".join(on) if on else "the engine's defaults")


def result_line(result: RunResult, plan: Plan | None = None) -> str:
    """Each level's throughput and TTFT, and with a plan its share of the decode ceiling; a
    client figure the level flagged gives way to the engine's own, labelled (app.analysis.metric_catalog
    decides which)."""
    parts = []
    for level in result.levels:
        figures, unreliable = level.summary.figures(), level.summary.unreliable()
        texts = []
        for key in ("output_tok_per_s", "ttft_ms_p50"):
            shown = key
            alt = catalog.metric(key).engine_alternative
            if key in unreliable and alt and figures.get(alt) is not None:
                shown = alt
            value = figures.get(shown)
            if value is not None:
                m = catalog.metric(shown)
                texts.append(f"{m.name} {m.format(value)} {m.unit}")
        limit = limit_figures(plan, level.summary) if plan is not None else None
        if limit is not None:
            texts.append(limit.text())
        parts.append(f"{level.label}: " + ", ".join(texts))
    return "; ".join(parts) or "no requests measured"
