"""``tunebench run PROFILE.toml [--endpoint URL] [--api-key K] [--json FILE]``: launch (or attach),
drive the workload, show one live progress line, print a final table, write the JSON result and
record the run in the run database (``app.recording``)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from app.analysis import metric_catalog as catalog
from app.bus import Bus, Event
from app.campaign import Campaign, CampaignResult, Step, repeat_lines
from app.cli.argtypes import add_db_argument, add_run_options, bounded_int
from app.cli.campaign_cmds import RUN_EVENTS, json_target, report_stored
from app.cli.campaign_cmds import write_json as write_doc
from app.cli.fleet_cmds import add_cluster_options, open_fleet
from app.cli.foreground import open_recorder, run_in_foreground
from app.cli.terminal import safe
from app.config import RunConfig
from app.errors import UserError
from app.events import EngineReady, LevelFinished, LogLine, Progress
from app.live_run import LiveRun
from app.load.metrics import level_notes
from app.planner.live import limit_figures, plan_for_run
from app.planner.plan import Plan
from app.profiles import ProfileError, load_profile, resolve_profile
from app.quality.lm_eval_run import DEMO_TASK, TaskEvalRequest
from app.quality.stored import stored_reference
from app.runner import Runner, RunResult, check_endpoint
from app.urls import check_api_key
from engine_adapters.base import feature_check_line

EXIT_FAILED, EXIT_CANCELLED = 1, 130

PLAIN_PROGRESS_S = 5.0


TABLE_KEYS = ("requests_per_s", "output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "tpot_ms_p50",
              "e2e_ms_p50", "queue_ms_p50", "goodput_rps", "prefix_cache_hit_rate", "spec_acceptance_rate",
              "client_lag_ms_p99")
"""The per-level table's figures (catalogue keys: the same names and values as Compare)."""
REASONING_KEYS = ("ttfat_ms_p50", "ttfat_ms_p99", "reasoning_tokens_total", "requests_reasoning_unfinished")
"""After TTFT, where some level reasoned (a level that did not has none: its TTFAT is its TTFT)."""


def table_columns(levels: list[dict[str, float]], flagged: set[str]) -> list[str]:
    """``TABLE_KEYS``, with each client figure some level flagged unreliable preceded by the
    engine's own figure (the headline switches to it, labelled "(engine)"), and the reasoning
    figures after TTFT where a level has them."""
    have = set().union(*levels) if levels else set()
    keys = list(TABLE_KEYS)
    if "ttfat_ms_p50" in have:
        at = keys.index("ttft_ms_p99") + 1
        keys[at:at] = REASONING_KEYS
    out: list[str] = []
    for key in keys:
        alt = catalog.metric(key).engine_alternative
        if key in flagged and alt and alt in have and alt not in out:
            out.append(alt)
        out.append(key)
    return out


def format_table(result: RunResult, plan: Plan | None = None) -> str:
    """The final per-level table (what a person reads after a run). A figure its level flagged
    unreliable is shown in [brackets] (the level's note says why), next to the engine's own.
    With a ``plan``, each level's output tok/s as a share of the decode ceiling at the batch its
    engine ran (``app.planner.live``); a rate above the ceiling reads "bug", never over 100%."""
    figures = [lv.summary.figures() for lv in result.levels]
    unreliable = [lv.summary.unreliable() for lv in result.levels]
    limits = [limit_figures(plan, lv.summary) if plan is not None else None for lv in result.levels]
    columns = table_columns(figures, set().union(*unreliable) if unreliable else set())
    header = ("level", "ok", "err", *(catalog.metric(k).header for k in columns),
              *(("% limit",) if any(limits) else ()))
    rows = [header]
    for lv, figs, bad, limit in zip(result.levels, figures, unreliable, limits, strict=True):
        cells = []
        for key in columns:
            text = catalog.metric(key).format(figs.get(key))
            cells.append(f"[{text}]" if key in bad and text != "-" else text)
        if any(limits):
            cells.append(limit.percent_text() if limit is not None else "-")
        rows.append((lv.label, str(lv.summary.completed), str(lv.summary.errors), *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("times in ms; TTFT from send, queue = scheduled -> sent; ITL per token; lag = client event-loop "
                 "lateness (docs/metrics.md)")
    if any(unreliable):
        lines.append("[x] = not to be trusted (the level's note says why); (engine) = the engine's own figure, "
                     "the one to read instead")
    if any(limits):
        lines.append("% limit = output tok/s against the decode ceiling at the batch the engine ran "
                     "(tunebench plan; docs/planner.md)")
    for lv, limit in zip(result.levels, limits, strict=True):
        extra = level_notes(lv.summary) + ([f"limit: {limit.detail()}"] if limit is not None else [])
        if extra:
            lines.append(f"{lv.label}: " + " | ".join(extra))
    return "\n".join(lines)


class _Console:
    """Turns bus events into one live line (a TTY) or plain lines (a pipe). Each event kind goes
    through the run's fold (``app.live_run.LiveRun``, which the GUI's live view hears too): its
    typed listeners say what to print, and it knows which cluster node each run is on."""

    def __init__(self, out: TextIO, verbose: bool) -> None:
        self.out, self.verbose = out, verbose
        self.tty = out.isatty()
        self._live = False
        self._last_plain = 0.0
        self._t_mono = 0.0  # the event being handled: plain progress lines are spaced on the bus's clock
        self.run = LiveRun()
        run = self.run
        run.phase_changed.connect(lambda p: self._say(p.run_id, f"[{p.phase.value}] {p.detail}"))
        run.engine_ready.connect(self._ready)
        run.level_started.connect(lambda p: self._say(p.run_id, f"level {p.index}: {p.label}"))
        run.progressed.connect(self._progress)
        run.level_finished.connect(lambda p: self._say(p.run_id, f"  done: {p.summary.completed} ok, "
                                                                  f"{p.summary.errors} errors, "
                                                                  f"{p.summary.output_tok_per_s:,.0f} tok/s"))
        run.finished.connect(lambda p: self._say(p.run_id, f"run {p.status}" + (f": {p.reason}" if p.reason else "")))

    def _line(self, text: str) -> None:
        """One line of output; whatever a server or a profile put in it is escaped (no raw CR or ESC)."""
        if self._live:
            self.out.write("\r\x1b[K")
            self._live = False
        self.out.write(safe(text) + "\n")
        self.out.flush()

    def _say(self, run_id: str | None, text: str) -> None:
        """A line about the run ``run_id``, after its node's name when it runs on a cluster."""
        self._line(self.run.on_node(run_id, text))

    def handle(self, ev: Event) -> None:
        p = ev.payload
        if isinstance(p, LogLine):  # each line as it comes (the fold batches them for the log view)
            if self.verbose or p.line.startswith("tunebench:"):
                self._say(p.run_id, f"  | {p.line}")
            return
        self._t_mono = ev.t_mono
        self.run.apply(ev)

    def _ready(self, p: EngineReady) -> None:
        self._say(p.run_id, f"attached to {p.base_url}" if p.startup_s is None
                  else f"engine ready at {p.base_url} ({p.startup_s:.1f} s)")
        for check in p.feature_checks:
            self._say(p.run_id, feature_check_line(check))

    def _progress(self, p: Progress) -> None:
        text = (f"  {p.requests_done}{'/' + str(p.planned) if p.planned else ''} requests, "
                f"{p.output_tok_per_s:,.0f} tok/s, {p.errors} errors, "
                f"{p.requests_in_flight} in flight, {p.elapsed_s:.0f} s")
        if self.tty:
            self.out.write("\r\x1b[K" + text)
            self.out.flush()
            self._live = True
        elif self._t_mono - self._last_plain >= PLAIN_PROGRESS_S:  # a pipe or a log file: a line now and then
            self._last_plain = self._t_mono
            self._say(p.run_id, text)


def write_json(result: RunResult | CampaignResult, path: Path) -> None:
    """Atomic: a crash never leaves half a result file. Secrets masked (engine_adapters.secrets).
    Said on stdout once written."""
    write_doc(result.to_dict() if isinstance(result, CampaignResult) else result.model_dump(mode="json"), path,
              announce=True)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = load_profile(resolve_profile(args.profile))
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    check_endpoint(args.endpoint)  # an empty or bad URL is refused before anything starts
    check_endpoint(args.gpu_metrics)
    json_path = json_target(args.json)  # before anything starts: the result is written only at the end
    api_key = args.api_key or (os.environ.get("TUNEBENCH_API_KEY") if args.endpoint else None)
    if api_key is not None:
        check_api_key(api_key)  # a newline would end the Authorization header and start another
    task_eval = task_eval_request(args)
    if task_eval is not None and args.cluster:
        raise UserError("--tasks scores a local run's engine: it does not run with --cluster")
    where = open_fleet(args, config)
    bus = Bus()
    sub = bus.subscribe(kinds=(*RUN_EVENTS, LevelFinished))  # a run's levels end in a line each
    recorder = open_recorder(bus, args)  # before run_started is published
    quality_reference = (stored_reference(recorder.store if recorder is not None else None, config.quality.reference)
                         if config.quality is not None and config.quality.reference else None)

    def make_runner(run_config: RunConfig, run_bus: Bus, **kwargs: Any) -> Runner:
        return Runner(run_config, run_bus, keep_requests=args.json_requests, gpu_metrics_url=args.gpu_metrics,
                      clients=where.clients(), task_eval=task_eval,
                      quality_reference=quality_reference, **kwargs)

    cancel = threading.Event()

    def work() -> RunResult | CampaignResult:
        if where.fleet is not None:  # each repeat is a trial placed on the cluster; they spread over its nodes
            return Campaign([Step(config.name, config, args.repeat)], bus, recorder=recorder, fleet=where.fleet,
                            telemetry=not args.no_telemetry, on_slot_bus=lambda slot_bus: slot_bus.attach(sub)
                            ).run(cancel, max_parallel=min(where.parallel, args.repeat))
        if args.repeat > 1:  # each repeat on a cold cache, the engine kept between them (app.campaign)
            return Campaign([Step(config.name, config, args.repeat)], bus, endpoint=args.endpoint, api_key=api_key,
                            recorder=recorder, telemetry=not args.no_telemetry, runner_factory=make_runner).run(cancel)
        return make_runner(config, bus, endpoint=args.endpoint, api_key=api_key,
                           telemetry=not args.no_telemetry).run(cancel)

    console = _Console(sys.stdout, args.verbose)
    outcome = run_in_foreground(work, sub, console.handle, cancel, name="tunebench-run", recorder=recorder)
    if isinstance(outcome, CampaignResult):
        return _report_campaign(outcome, json_path, recorder)
    result: RunResult = outcome
    unstored = recorder.check_stored(result) if recorder is not None else None  # not "completed" if not stored
    if result.levels:
        print()
        plan, no_plan = plan_for_run(result.config, result.hardware)
        print(format_table(result, plan))
        if no_plan:
            print(no_plan)
    if json_path is not None:
        write_json(result, json_path)
    stored_line = None
    if recorder is not None and recorder.recorded:
        run_id = recorder.recorded[-1]
        stored_line = f"stored{' incompletely' if unstored else ''} as run {run_id} (tunebench runs show {run_id})"
    report_stored(recorder, stored_line)
    if unstored:
        print(f"run {result.status}: {unstored}", file=sys.stderr)
    if result.status == "cancelled":
        return EXIT_CANCELLED
    return 0 if result.status == "completed" else EXIT_FAILED


def task_eval_request(args: argparse.Namespace) -> TaskEvalRequest | None:
    """``--tasks`` (with ``--task-path`` and ``--task-limit``) as lm-eval's request; None without it."""
    tasks = [t.strip() for given in args.tasks or [] for t in given.split(",") if t.strip()]
    if not tasks:
        if args.task_path or args.task_limit:
            raise UserError("--task-path and --task-limit go with --tasks (e.g. --tasks " + DEMO_TASK + ")")
        return None
    return TaskEvalRequest(tasks=tasks, include_paths=list(args.task_path or []), limit=args.task_limit)


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", action="append", metavar="NAME[,NAME]",
                        help=f"after the load, score these lm-eval tasks against the engine, offline, and store their "
                             f"accuracy with its standard error ({DEMO_TASK}: the demo model's own task, shipped; "
                             "needs `tunebench engine install lm-eval`)")
    parser.add_argument("--task-path", action="append", metavar="DIR",
                        help="a folder of your own lm-eval task YAML files and their local data (repeatable)")
    parser.add_argument("--task-limit", type=bounded_int(1, 10**7), metavar="N",
                        help="score the first N documents of each task (default: all)")


def _report_campaign(campaign: CampaignResult, json_path: Path | None, recorder: Any) -> int:
    """The tables of every repeat, then each figure's mean and 95% confidence interval."""
    for step in campaign.steps:
        plan = plan_for_run(step.step.config, step.runs[0].hardware)[0] if step.runs else None
        for i, result in enumerate(step.runs):
            if result.levels:
                print(f"\nrepeat {i + 1} of {step.step.repeats} ({result.status}):")
                print(format_table(result, plan))
        lines = repeat_lines(step)
        if lines:
            print(f"\n{step.step.name}: {len(step.runs)} repeat(s), each on a cold prefix cache")
            for line in lines:
                print(f"  {line}")
    if json_path is not None:
        write_json(campaign, json_path)
    ids = [i for step in campaign.steps for i in step.stored_ids]
    stored_line = None
    if ids:
        stored_line = (f"stored as runs {', '.join(map(str, ids))} (tag {campaign.steps[0].repeat_tag}; "
                       f"tunebench compare {ids[-1]} <other run> compares the whole set)")
    report_stored(recorder, stored_line)
    if campaign.status == "cancelled":
        return EXIT_CANCELLED
    if campaign.status != "completed":
        print(f"tunebench: {campaign.reason}", file=sys.stderr)
    return 0 if campaign.status == "completed" else EXIT_FAILED


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a profile's workload against its engine (or an endpoint) and measure it")
    run.add_argument("profile", help="profile file or shipped profile name (e.g. cpu-demo)")
    run.add_argument("--endpoint", help="attach to a running OpenAI-compatible server instead of launching one")
    run.add_argument("--api-key", help="API key for --endpoint (default: $TUNEBENCH_API_KEY)")
    run.add_argument("--gpu-metrics", metavar="URL",
                     help="GPU telemetry from a DCGM exporter's (or nvidia_gpu_exporter's) /metrics (the engine's machine, e.g. a Kubernetes "
                          "node's :9400) instead of local NVML")
    run.add_argument("--json", metavar="FILE", help="write the result (levels and their figures) as JSON")
    run.add_argument("--json-requests", action="store_true",
                     help="with --json: every request record too (kept in memory for the whole run; the run "
                          "database has them either way)")
    add_run_options(run, store_help="do not record the run in the database")
    add_db_argument(run)
    run.add_argument("--repeat", type=bounded_int(1, 1000), default=1, metavar="N",
                     help="run the profile N times, each on a cold prefix cache with the engine kept, and report "
                          "each figure's mean and 95%% confidence interval (compare treats the set as one)")
    add_task_arguments(run)
    add_cluster_options(run)
    run.add_argument("--client-nodes", type=bounded_int(1, 4096), metavar="K",
                     help="with --endpoint and --cluster: send the load from K nodes of the cluster (one client "
                          "worker each, the level split between them); the records merge into one level")
    run.set_defaults(handler=cmd_run)
