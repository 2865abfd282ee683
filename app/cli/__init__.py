"""The ``tunebench`` command line. Each command group registers itself from its own module;
errors a user can fix are printed as one line with a non-zero exit code, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from app.cli import engine_cmds
from app.errors import UserError
from engine_adapters.launcher import reap_orphans

EXIT_OK, EXIT_USAGE_OR_INPUT, EXIT_ENGINE_FAILED, EXIT_INTERRUPTED = 0, 2, 3, 130

# Command groups register their subparsers here: (module register functions).
_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [engine_cmds.register]


def _optional_registrars() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Groups whose modules exist (run, monitor, runs/compare/export, gui)."""
    import importlib

    found = []
    for name in ("run_cmds", "monitor_cmds", "store_cmds", "gui_cmds"):
        try:
            module = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"app.cli.{name}":
                continue
            raise
        found.append(module.register)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunebench", description="Tune LLM inference engines and measure what "
                                     "each acceleration feature buys.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in [*_REGISTRARS, *_optional_registrars()]:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE_OR_INPUT
    try:
        # An engine left running by a tunebench that died is stopped at the next start.
        reap_orphans(log=lambda message: print(f"tunebench: {message}", file=sys.stderr))
        return int(handler(args) or 0)
    except UserError as exc:
        print(f"tunebench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tunebench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and closed early
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
