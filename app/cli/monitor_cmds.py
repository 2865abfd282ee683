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
from app.cli.argtypes import MAX_PID, bounded_float, bounded_int, endpoint_url
from app.cli.argtypes import api_key as api_key_arg
from app.cli.terminal import safe
from app.errors import UserError
from app.telemetry import TelemetryCollector
from app.telemetry.engine_metrics import metrics_url_from
from app.telemetry.view import render
from app.urls import check_api_key
from app.workload import MAX_DURATION_S
from engine_adapters.launcher import registered_engines
from engine_adapters.registry import METRICS, get_engine_metrics
from engine_adapters.secrets import mask_url

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


def cmd_monitor(args: argparse.Namespace) -> int:
    url, engine_pid = _target(args)
    if engine_pid is not None and not _alive(engine_pid):
        raise UserError(f"--engine-pid: no process {engine_pid}")
    api_key = args.api_key or next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)
    if api_key is not None:
        check_api_key(api_key)  # one from the environment has not been through argparse
    bus = Bus()
    sub = bus.subscribe(maxlen=10_000)
    collector = TelemetryCollector(bus, metrics_url=url, api_key=api_key, metric_names=get_engine_metrics(args.engine).metric_names,
                                   engine_pid=engine_pid, engine_interval_s=args.interval,
                                   gpu_metrics_url=args.gpu_metrics)
    latest: dict[str, dict[str, float]] = {}
    shown_url = None if url is None else mask_url(url)  # the screen never shows a user:password@
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
            _show(render(latest, collector.support(), collector.stats(), shown_url), shown_url, tty)
    except KeyboardInterrupt:  # Ctrl-C is how a live view ends: not an error
        pass
    finally:
        collector.stop()
    return 0


def _show(lines: list[str], url: str | None, tty: bool) -> None:
    header = f"tunebench monitor  {time.strftime('%H:%M:%S')}  {url or 'no engine'}" + ("  (Ctrl-C to quit)" if tty else "")
    text = "\n".join(safe(line) for line in [header, *lines])  # scrape errors quote what a server sent
    if tty:
        sys.stdout.write("\x1b[H\x1b[J" + text + "\n")
    else:
        sys.stdout.write(text + "\n\n")
    sys.stdout.flush()


def register(sub: Any) -> None:
    monitor = sub.add_parser("monitor", help="live GPU / host / engine telemetry until Ctrl-C")
    monitor.add_argument("--endpoint", type=endpoint_url, help="engine base URL or /metrics URL (default: the engine tunebench started)")
    monitor.add_argument("--api-key", type=api_key_arg, help=f"bearer token for the endpoint (default: ${API_KEY_ENV[0]} or ${API_KEY_ENV[1]})")
    monitor.add_argument("--gpu-metrics", type=endpoint_url, metavar="URL",
                         help="GPU telemetry from a DCGM exporter's (or nvidia_gpu_exporter's) /metrics on the engine's machine, instead of local NVML")
    monitor.add_argument("--engine", choices=sorted(METRICS), default="vllm", help="metric names to read (default vllm)")
    monitor.add_argument("--engine-pid", type=bounded_int(1, MAX_PID), help="engine process whose tree RSS/CPU to show")
    monitor.add_argument("--interval", type=bounded_float(0.05, 3600.0), default=1.0, help="refresh and scrape interval in seconds (default 1)")
    monitor.add_argument("--duration", type=bounded_float(0.0, MAX_DURATION_S, exclusive_minimum=True), help="stop after this many seconds (default: until Ctrl-C)")
    monitor.set_defaults(handler=cmd_monitor)
