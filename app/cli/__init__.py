"""The ``tunebench`` command line. Each command group registers itself from its own module;
errors a user can fix are printed as one line with a non-zero exit code, never a traceback."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from app.cli import engine_cmds
from app.cli.terminal import safe
from engine_adapters.errors import EXIT_INPUT, TunebenchError
from engine_adapters.launcher import reap_orphans
from engine_adapters.paths import UnusableDirectory

EXIT_OK, EXIT_USAGE_OR_INPUT, EXIT_INTERRUPTED = 0, EXIT_INPUT, 130  # 3 (engine failed): TunebenchError

# Command groups register their subparsers here: (module register functions).
_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [engine_cmds.register]


def _optional_registrars() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Groups whose modules exist (run, monitor, runs/compare/export, plan, gui, ladder, tune, capacity)."""
    import importlib

    found = []
    for name in ("run_cmds", "monitor_cmds", "store_cmds", "plan_cmds", "gui_cmds", "ladder_cmds", "tune_cmds",
                 "capacity_cmds", "db_cmds", "resume_cmds", "fleet_cmds", "explain_cmds", "race_cmds"):
        try:
            module = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"app.cli.{name}":
                continue
            raise
        found.append(module.register)
    return found


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the rule for every error a user can cause), pointing at --help
    instead of printing the whole usage block. Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE_OR_INPUT, f"{self.prog}: error: {safe(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tunebench", description="Tune LLM inference engines and measure what "
                                     "each acceleration feature buys.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in [*_REGISTRARS, *_optional_registrars()]:
        register(sub)
    return parser


def restore_sigint() -> None:
    """Make Ctrl-C raise KeyboardInterrupt even when SIGINT was inherited as ignored (a job
    started in the background by a non-interactive shell gets SIG_IGN, and Python keeps it).
    Engines started afterwards then inherit the default action too, so SIGINT stops them."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _reap_orphans() -> None:
    """An engine left running by a tunebench that died is stopped at the next start. Without a
    usable state directory there is no registry to read: say so once and go on (a command that
    launches an engine needs it and fails with the same line)."""
    try:
        reap_orphans(log=lambda message: print(f"tunebench: {safe(message)}", file=sys.stderr))
    except UnusableDirectory as exc:
        print(f"tunebench: warning: no engine registry: {safe(exc)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    restore_sigint()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (argparse printed it) or --help: an exit code, as for handlers
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE_OR_INPUT
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE_OR_INPUT
    try:
        _reap_orphans()
        return int(handler(args) or 0)
    except TunebenchError as exc:  # UserError, EngineFailed, StoreError, RuntimeErrorMessage, ...
        print(f"tunebench: error: {safe(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tunebench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and closed early
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
