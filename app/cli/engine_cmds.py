"""``tunebench engine start|stop|flags|install``, ``tunebench demo-model``, ``tunebench profile check``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from app.cli.argtypes import bounded_int
from app.engines import check_config, launch_engine
from app.errors import EngineFailed, UserError
from app.planner.plan import kv_plan_check
from app.profiles import ProfileError, load_profile, resolve_profile
from engine_adapters.base import Phase, feature_check_line
from engine_adapters.launcher import EngineStartError, stop_registered
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import (
    MANAGED_RUNTIMES,
    MANAGED_TOOLS,
    RUNTIME_ADDONS,
    RuntimeErrorMessage,
    ensure_demo_model,
    install_managed,
)


def _load(path: str) -> Any:
    try:
        return load_profile(resolve_profile(path))
    except ProfileError as exc:
        raise UserError(str(exc)) from None


def cmd_engine_start(args: argparse.Namespace) -> int:
    config = _load(args.profile)
    if args.port is not None:
        config.engine.port = args.port

    def on_phase(phase: Phase, detail: str) -> None:
        print(f"[{phase.value}] {detail}", flush=True)

    def on_log(line: str) -> None:
        if args.verbose:
            print(f"  | {line}", flush=True)

    engine = launch_engine(config, force=args.force, on_phase=on_phase, on_log=on_log)
    stop_requested = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    try:
        try:
            ready = engine.wait_ready(cancel=stop_requested)
        except EngineStartError as exc:
            tail = "\n".join(f"  | {line}" for line in engine.snapshot_log()[-8:])
            if tail and not args.verbose:
                print(tail, file=sys.stderr)
            raise EngineFailed(str(exc)) from None
        print(f"engine ready at {ready.base_url} (pid {engine.pid}, {ready.startup_s:.1f} s)", flush=True)
        if ready.kv_cache:
            print(f"KV cache: {ready.kv_cache.get('kv_cache_tokens', 0):,.0f} tokens", flush=True)
            beside_plan = kv_plan_check(config, ready.kv_cache.get("kv_cache_tokens", 0))
            if beside_plan:
                print(beside_plan, flush=True)
        if engine.api_key:
            print(f"API key: {engine.api_key}  (export VLLM_API_KEY or send 'Authorization: Bearer ...')", flush=True)
        for check in engine.verify_features():
            print(feature_check_line(check), flush=True)
        print("Ctrl-C to stop", flush=True)
        while engine.is_running() and not stop_requested.wait(0.5):
            pass
        if not engine.is_running():
            engine.wait_exited()
        if not engine.is_running() and not stop_requested.is_set() and engine.phase == Phase.FAILED:
            raise EngineFailed(f"the engine exited: {engine.diagnosis or engine.exit_code}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        how = engine.stop()
        print(f"engine stopped ({how})", flush=True)
    return 0


def cmd_engine_stop(args: argparse.Namespace) -> int:
    stopped = stop_registered(log=print)
    if not stopped:
        print("no running engine started by tunebench")
    return 0


def cmd_engine_flags(args: argparse.Namespace) -> int:
    config = _load(args.profile)
    adapter = get_adapter(config.engine.kind)
    try:
        flags = adapter.discover_flags(config.engine)
    except RuntimeErrorMessage as exc:
        raise UserError(str(exc)) from None
    print(f"{adapter.display_name} {flags.version}: {len(flags.flags)} flags")
    for flag in flags.flags:
        choices = flags.choices.get(flag)
        print(f"  {flag}" + (f"  {{{','.join(choices)}}}" if choices else ""))
    return 0


def cmd_engine_install(args: argparse.Namespace) -> int:
    try:
        path = install_managed(args.name, log=lambda m: print(m, file=sys.stderr))
    except RuntimeErrorMessage as exc:
        raise UserError(str(exc)) from None
    print(path)
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    try:
        path = ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    except RuntimeErrorMessage as exc:
        raise UserError(str(exc)) from None
    print(path)
    return 0


def cmd_profile_check(args: argparse.Namespace) -> int:
    config = _load(args.profile)
    report = check_config(config, discover_flags=not args.no_discover)
    for note in report.notes:
        print(f"note: {note}")
    for issue in report.issues:
        print(str(issue))
    if report.flags:
        print(f"checked against {get_adapter(config.engine.kind).display_name} {report.flags.version}")
    if report.errors:
        print(f"{args.profile}: {len(report.errors)} error(s)")
        return 2
    print(f"{args.profile}: OK" + (f" ({len(report.warnings)} warning(s))" if report.warnings else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    engine = sub.add_parser("engine", help="start, stop, inspect or install engines")
    esub = engine.add_subparsers(dest="engine_command", metavar="ACTION", required=True)

    start = esub.add_parser("start", help="launch the engine of a profile and keep it running until Ctrl-C")
    start.add_argument("profile", help="profile file or shipped profile name (e.g. cpu-demo)")
    start.add_argument("--port", type=bounded_int(0, 65535), help="override the profile's port (0 = free port)")
    start.add_argument("--force", action="store_true", help="launch even if validation finds errors")
    start.add_argument("-v", "--verbose", action="store_true", help="print the engine log")
    start.set_defaults(handler=cmd_engine_start)

    stop = esub.add_parser("stop", help="stop every engine tunebench started (and orphans)")
    stop.set_defaults(handler=cmd_engine_stop)

    flags = esub.add_parser("flags", help="list the flags the installed engine version supports")
    flags.add_argument("profile", nargs="?", default="cpu-demo", help="profile naming the runtime (default cpu-demo)")
    flags.set_defaults(handler=cmd_engine_flags)

    install = esub.add_parser("install", help="create a managed engine runtime, or a tool that runs beside the "
                              "engines (lm-eval), or a runtime's add-on beside it (vllm-cpu-pd: NIXL and vllm-router), "
                              "in the user cache")
    install.add_argument("name", choices=sorted({*MANAGED_RUNTIMES, *MANAGED_TOOLS, *RUNTIME_ADDONS}))
    install.set_defaults(handler=cmd_engine_install)

    demo = sub.add_parser("demo-model", help="generate the tiny local demo model and print its path")
    demo.set_defaults(handler=cmd_demo_model)

    profile = sub.add_parser("profile", help="work with profiles")
    psub = profile.add_subparsers(dest="profile_command", metavar="ACTION", required=True)
    check = psub.add_parser("check", help="validate a profile without launching")
    check.add_argument("profile")
    check.add_argument("--no-discover", action="store_true", help="do not ask the installed engine for its flags")
    check.set_defaults(handler=cmd_profile_check)
