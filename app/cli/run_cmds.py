"""``tunebench run PROFILE.toml [--endpoint URL] [--api-key K] [--json FILE]``: launch (or attach),
drive the workload, show one live progress line, print a final table, write the JSON result and
record the run in the run database (``app.recording``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from app.bus import Bus, Event
from app.errors import UserError
from app.load.metrics import format_figure, level_notes
from app.profiles import ProfileError, load_profile, resolve_profile
from app.runner import Runner, RunResult

EXIT_FAILED, EXIT_CANCELLED = 1, 130
PLAIN_PROGRESS_S = 5.0


def format_table(result: RunResult) -> str:
    """The final per-level table (what a person reads after a run)."""
    header = ("level", "ok", "err", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "TPOT p50",
              "E2E p50", "queue p50", "goodput", "cache hit", "spec acc", "lag p99")
    rows = [header]
    for lv in result.levels:
        s = lv.summary
        rows.append((
            lv.label, str(s.completed), str(s.errors), format_figure(s.request_throughput_rps, 2), format_figure(s.output_tok_per_s, 0),
            format_figure(s.ttft_ms.median), format_figure(s.ttft_ms.p99), format_figure(s.itl_ms.median, 2), format_figure(s.tpot_ms.median, 2),
            format_figure(s.e2e_ms.median, 0), format_figure(s.queue_ms.median, 2),
            "-" if s.goodput_rps is None else f"{s.goodput_rps:.2f}/s",
            "-" if s.engine.prefix_cache_hit_rate is None else f"{s.engine.prefix_cache_hit_rate:.0%}",
            "-" if s.engine.spec_acceptance_rate is None else f"{s.engine.spec_acceptance_rate:.0%}",
            format_figure(s.client_lag_ms.p99)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("times in ms; TTFT from send, queue = scheduled -> sent; ITL per token; lag = client event-loop "
                 "lateness (docs/metrics.md)")
    for lv in result.levels:
        extra = level_notes(lv.summary)
        if extra:
            lines.append(f"{lv.label}: " + " | ".join(extra))
    return "\n".join(lines)


class _Console:
    """Turns bus events into one live line (a TTY) or plain lines (a pipe)."""

    def __init__(self, out: TextIO, verbose: bool) -> None:
        self.out, self.verbose = out, verbose
        self.tty = out.isatty()
        self._live = False
        self._last_plain = 0.0

    def _line(self, text: str) -> None:
        if self._live:
            self.out.write("\r\x1b[K")
            self._live = False
        self.out.write(text + "\n")
        self.out.flush()

    def handle(self, ev: Event) -> None:
        p: dict[str, Any] = ev.payload or {}
        if ev.kind == "phase":
            self._line(f"[{p.get('phase')}] {p.get('detail', '')}")
        elif ev.kind == "log":
            line = str(p.get("line", ""))
            if self.verbose or line.startswith("tunebench:"):
                self._line(f"  | {line}")
        elif ev.kind == "engine_ready":
            startup = p.get("startup_s")
            if startup is None:
                self._line(f"attached to {p.get('base_url')}")
            else:
                self._line(f"engine ready at {p.get('base_url')} ({startup:.1f} s)")
            for check in p.get("feature_checks") or []:
                state = {True: "active", False: "NOT ACTIVE", None: "unknown"}[check.get("active")]
                self._line(f"feature {check.get('key')}={check.get('requested')}: {state}")
        elif ev.kind == "level_started":
            self._line(f"level {p.get('index')}: {p.get('label')}")
        elif ev.kind == "progress":
            planned = p.get("planned")
            text = (f"  {p.get('done')}{'/' + str(planned) if planned else ''} requests, "
                    f"{p.get('output_tok_per_s', 0):,.0f} tok/s, {p.get('errors')} errors, "
                    f"{p.get('in_flight')} in flight, {p.get('elapsed_s', 0):.0f} s")
            if self.tty:
                self.out.write("\r\x1b[K" + text)
                self.out.flush()
                self._live = True
            elif ev.t_mono - self._last_plain >= PLAIN_PROGRESS_S:  # a pipe or a log file: a line now and then
                self._last_plain = ev.t_mono
                self._line(text)
        elif ev.kind == "level_finished":
            s = p.get("summary") or {}
            self._line(f"  done: {s.get('completed')} ok, {s.get('errors')} errors, "
                       f"{s.get('output_tok_per_s', 0):,.0f} tok/s")
        elif ev.kind == "run_finished":
            self._line(f"run {p.get('status')}" + (f": {p.get('reason')}" if p.get("reason") else ""))


def write_json(result: RunResult, path: Path) -> None:
    """Atomic: a crash never leaves half a result file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(result.model_dump_json(indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write the result: {exc.strerror}") from None


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = load_profile(resolve_profile(args.profile))
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.parent.exists():
        raise UserError(f"{json_path}: its folder does not exist")
    api_key = args.api_key or (os.environ.get("TUNEBENCH_API_KEY") if args.endpoint else None)
    bus = Bus()
    sub = bus.subscribe(kinds=("phase", "log", "engine_ready", "level_started", "progress", "level_finished",
                               "run_finished"))
    recorder = None
    if not args.no_store:
        from app.recording import record_to_default_store
        from db.store import StoreError

        try:
            recorder = record_to_default_store(bus, args.db)  # before run_started is published
        except (StoreError, OSError) as exc:
            raise UserError(f"cannot open the run database: {exc}") from None
    runner = Runner(config, bus, endpoint=args.endpoint, api_key=api_key, telemetry=not args.no_telemetry)
    cancel = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = runner.run(cancel)
        except BaseException as exc:  # re-raised on the main thread
            box["error"] = exc

    console = _Console(sys.stdout, args.verbose)
    previous = signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    thread = threading.Thread(target=work, name="tunebench-run", daemon=True)
    thread.start()
    try:
        while thread.is_alive() or len(sub):
            try:
                for ev in sub.drain(timeout_s=0.2):
                    if isinstance(ev, Event):
                        console.handle(ev)
            except KeyboardInterrupt:
                if not cancel.is_set():
                    print("\ncancelling: stopping requests and the engine (Ctrl-C again does not hurry it)",
                          file=sys.stderr)
                cancel.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if recorder is not None:
            recorder.close()
    if "error" in box:
        raise box["error"]
    result: RunResult = box["result"]
    if result.levels:
        print()
        print(format_table(result))
    if json_path is not None:
        write_json(result, json_path)
        print(f"result written to {json_path}")
    if recorder is not None:
        for problem in recorder.errors:
            print(f"tunebench: store: {problem}", file=sys.stderr)
        if recorder.recorded:
            print(f"stored as run {recorder.recorded[-1]} (tunebench runs show {recorder.recorded[-1]})")
    if result.status == "cancelled":
        return EXIT_CANCELLED
    return 0 if result.status == "completed" else EXIT_FAILED


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a profile's workload against its engine (or an endpoint) and measure it")
    run.add_argument("profile", help="profile file or shipped profile name (e.g. cpu-demo)")
    run.add_argument("--endpoint", help="attach to a running OpenAI-compatible server instead of launching one")
    run.add_argument("--api-key", help="API key for --endpoint (default: $TUNEBENCH_API_KEY)")
    run.add_argument("--json", metavar="FILE", help="write the full result (levels, requests) as JSON")
    run.add_argument("--no-telemetry", action="store_true", help="do not sample GPU/host/engine telemetry")
    run.add_argument("--db", metavar="PATH", default=None,
                     help="run database (default: $TUNEBENCH_DB or runs.db in the user data directory)")
    run.add_argument("--no-store", action="store_true", help="do not record the run in the database")
    run.add_argument("-v", "--verbose", action="store_true", help="print the engine log")
    run.set_defaults(handler=cmd_run)
