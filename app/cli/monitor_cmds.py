"""``tunebench monitor``: a compact live view of GPU, host and engine telemetry until Ctrl-C --
like nvitop, for an inference server. Without ``--endpoint`` it watches the one engine tunebench
started (from the engine registry), or just the GPU and host when none runs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from app.bus import Bus, Sample
from app.errors import UserError
from app.telemetry import TelemetryCollector
from app.telemetry.engine_metrics import metrics_url_from
from app.telemetry.view import render
from engine_adapters import llamacpp, sglang, vllm
from engine_adapters.base import MetricNames
from engine_adapters.launcher import registered_engines

METRIC_TABLES: dict[str, MetricNames] = {
    "vllm": vllm.METRIC_NAMES, "sglang": sglang.METRIC_NAMES, "llamacpp": llamacpp.METRIC_NAMES,
}
API_KEY_ENV = ("TUNEBENCH_API_KEY", "VLLM_API_KEY")


def _target(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(metrics URL or None, engine PID or None) from the arguments or the engine registry."""
    if args.endpoint:
        try:
            return metrics_url_from(args.endpoint), args.engine_pid
        except ValueError as exc:
            raise UserError(f"--endpoint: {exc}") from None
    engines = [r for r in registered_engines() if _alive(r.pid)]
    if len(engines) > 1:
        ports = ", ".join(str(r.port) for r in engines)
        raise UserError(f"{len(engines)} engines are running (ports {ports}): choose one with --endpoint http://127.0.0.1:PORT")
    if engines:
        return f"http://127.0.0.1:{engines[0].port}/metrics", args.engine_pid or engines[0].pid
    return None, args.engine_pid


def _alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def cmd_monitor(args: argparse.Namespace) -> int:
    url, engine_pid = _target(args)
    if engine_pid is not None and not _alive(engine_pid):
        raise UserError(f"--engine-pid: no process {engine_pid}")
    api_key = args.api_key or next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)
    bus = Bus()
    sub = bus.subscribe(maxlen=10_000)
    collector = TelemetryCollector(bus, metrics_url=url, api_key=api_key, metric_names=METRIC_TABLES[args.engine],
                                   engine_pid=engine_pid, engine_interval_s=args.interval)
    latest: dict[str, dict[str, float]] = {}
    tty = sys.stdout.isatty()
    deadline = time.monotonic() + args.duration if args.duration else None
    collector.start()
    try:
        while deadline is None or time.monotonic() < deadline:
            wait_s = args.interval if deadline is None else max(0.0, min(args.interval, deadline - time.monotonic()))
            time.sleep(wait_s)
            for item in sub.drain():
                if isinstance(item, Sample):
                    latest.setdefault(item.source, {}).update(item.values)
            _show(render(latest, collector.support(), collector.stats(), url), url, tty)
    except KeyboardInterrupt:  # Ctrl-C is how a live view ends: not an error
        pass
    finally:
        collector.stop()
    return 0


def _show(lines: list[str], url: str | None, tty: bool) -> None:
    header = f"tunebench monitor  {time.strftime('%H:%M:%S')}  {url or 'no engine'}" + ("  (Ctrl-C to quit)" if tty else "")
    text = "\n".join([header, *lines])
    if tty:
        sys.stdout.write("\x1b[H\x1b[J" + text + "\n")
    else:
        sys.stdout.write(text + "\n\n")
    sys.stdout.flush()


def register(sub: Any) -> None:
    monitor = sub.add_parser("monitor", help="live GPU / host / engine telemetry until Ctrl-C")
    monitor.add_argument("--endpoint", help="engine base URL or /metrics URL (default: the engine tunebench started)")
    monitor.add_argument("--api-key", help=f"bearer token for the endpoint (default: ${API_KEY_ENV[0]} or ${API_KEY_ENV[1]})")
    monitor.add_argument("--engine", choices=sorted(METRIC_TABLES), default="vllm", help="metric names to read (default vllm)")
    monitor.add_argument("--engine-pid", type=int, help="engine process whose tree RSS/CPU to show")
    monitor.add_argument("--interval", type=_positive, default=1.0, help="refresh and scrape interval in seconds (default 1)")
    monitor.add_argument("--duration", type=_positive, help="stop after this many seconds (default: until Ctrl-C)")
    monitor.set_defaults(handler=cmd_monitor)
