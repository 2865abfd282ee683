"""What ``tunebench ladder``/``ladders`` (``app.cli.ladder_cmds``) and ``tunebench tune``/``tunes``
(``app.cli.tune_cmds``) share: both drive an ``app.campaign`` owner in the foreground, print its
table, write ``--json`` atomically, read campaigns back from the run store and end with the same
exit codes. ``tunebench run`` shares the ``--json`` check and writer too. Each face keeps its own
wording; this module has none of its own beyond the store's and the exit lines' shape. No
``register``: it adds no command.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pydantic_core

from app.bus import Bus, Event
from app.cli.argtypes import json_parent
from app.cli.foreground import open_recorder, run_in_foreground
from app.cli.terminal import safe
from app.errors import UserError
from app.events import EngineReady, LevelStarted, LogLine, PhaseChanged, Progress, RunFinished, RunStarted
from app.export.files import STDOUT, check_folder, check_target, write_problem
from app.export.launch import SINGLE_NODE_FORMATS
from app.profiles import Profile, ProfileError, load_profile_file, resolve_profile
from engine_adapters.secrets import mask_obj

EXIT_FAILED, EXIT_CANCELLED = 1, 130
SCRIPT_FORMATS = SINGLE_NODE_FORMATS  # a single winner runs on one machine
"""The launch formats a campaign's step or pick exports to (one node: no ray, no k8s-multinode)."""
RUN_EVENTS: tuple[type, ...] = (RunStarted, PhaseChanged, LogLine, EngineReady, LevelStarted, Progress, RunFinished)
"""What the run console prints while a campaign runs."""

T = TypeVar("T")
Owner = TypeVar("Owner")


def load_profile_arg(name: str) -> tuple[Profile, str]:
    """The profile named on the command line (its notes said on stderr) and its stem (the
    campaign's profile name)."""
    try:
        path = resolve_profile(name)
        profile = load_profile_file(path)
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    for note in profile.notes:
        print(safe(f"tunebench: note: {note}"), file=sys.stderr)
    return profile, path.stem


def json_target(arg: str | None) -> Path | None:
    """``--json FILE`` of ``run``, ``ladder`` and ``tune``, checked before anything runs: the result
    is written only at the end, so a path that cannot take it is refused now, not after a run that
    was measured and stored."""
    if not arg:
        return None
    path = Path(arg)
    try:
        check_target(path)
        check_folder(path)
    except UserError as exc:
        raise UserError(f"--json: {exc}") from None
    return path


def write_json(doc: dict[str, Any], path: Path, *, announce: bool = False) -> None:
    """Atomic: a crash never leaves half a result file. Secrets masked (engine_adapters.secrets)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(pydantic_core.to_json(mask_obj(doc), indent=1, inf_nan_mode="null"))
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write the result: {write_problem(path, exc)}") from None
    if announce:
        print(f"result written to {path}")


def run_campaign(bus: Bus, args: argparse.Namespace, build: Callable[[Any, Callable[[Bus], None]], Owner],
                 handle: Callable[[Event], None],
                 *, name: str, extra_events: tuple[type, ...] = (), **foreground: Any) -> tuple[Owner, Any, Any]:
    """Open the recorder, ``build(recorder, follow)`` the campaign's owner (the recorder is closed
    when that fails; ``follow(slot_bus)`` sends a side-by-side slot's events to ``handle`` too) and
    ``owner.run(cancel)`` in the foreground, the bus's events going to ``handle``.
    Returns (owner, its final state, the recorder or None)."""
    sub = bus.subscribe(kinds=(*RUN_EVENTS, *extra_events))
    recorder = open_recorder(bus, args)
    try:
        owner = build(recorder, lambda slot_bus: slot_bus.attach(sub))
    except BaseException:
        if recorder is not None:
            recorder.close()
        raise
    cancel = threading.Event()
    runner: Any = owner
    state = run_in_foreground(lambda: runner.run(cancel), sub, handle, cancel, name=name, recorder=recorder,
                              **foreground)
    return owner, state, recorder


def report_stored(recorder: Any, stored_line: str | None) -> None:
    """After a campaign: what the store could not take (stderr), then where it went."""
    if recorder is None:
        return
    for problem in recorder.errors:
        print(safe(f"tunebench: store: {problem}"), file=sys.stderr)
    if stored_line:
        print(safe(stored_line))


def exit_code(what: str, status: str, reason: str | None, *, ok: bool = True, cancelled_note: str | None = None) -> int:
    """130 when cancelled (after ``cancelled_note``), 1 with one line when the campaign failed or
    did not give what it is for (``ok``), else 0."""
    if status == "cancelled":
        if cancelled_note:
            print(safe(cancelled_note), file=sys.stderr)
        return EXIT_CANCELLED
    if status != "completed" or not ok:
        print(safe(f"tunebench: {what} {status}" + (f": {reason}" if reason else "")), file=sys.stderr)
        return EXIT_FAILED
    return 0


def check_resume_stores(args: argparse.Namespace, kind: str) -> None:
    """``--resume`` reads the campaign back from the run store, so it needs one: refused with
    ``--no-store`` before anything starts."""
    if args.no_store and args.resume is not None:
        raise UserError(f"--resume reads the {kind} from the run database: it cannot go with --no-store")


# --- stored campaigns ---------------------------------------------------------------------------

def with_store(args: argparse.Namespace, read: Callable[[Any], T]) -> T:
    """``read(store)`` on the run store of ``--db``, closed after (the store module is imported late:
    the command line should not pay for it at start)."""
    from app.cli.store_cmds import open_store

    with open_store(args) as store:
        return read(store)


def print_json(doc: Any) -> int:
    """``--json`` of a stored campaign (or a list of them) on standard output."""
    print(pydantic_core.to_json(doc, indent=2, inf_nan_mode="null").decode())
    return 0


def print_list(items: list[T], *, as_json: bool, dump: Callable[[T], Any], empty: str,
               line: Callable[[T], str]) -> int:
    """``ladders list`` / ``tunes list``: JSON, the line saying there is none, or a line each."""
    if as_json:
        return print_json([dump(item) for item in items])
    if not items:
        print(empty)
        return 0
    for item in items:
        print(safe(line(item)))
    return 0


def when_text(wall_s: float) -> str:
    """A stored campaign's start, as the lists show it."""
    return datetime.fromtimestamp(wall_s).strftime("%Y-%m-%d %H:%M")


def to_stdout(output: str) -> bool:
    return output in (STDOUT, "-")


def check_output(output: str) -> None:
    """Refuse an unwritable ``-o`` before the work (standard output always does)."""
    if not to_stdout(output):
        check_target(Path(output))


def write_output(text: str, fmt: str, output: str, said: str | None = None) -> int:
    """A report or launch script to ``-o`` (``-``: standard output), saying so on stderr."""
    from app.export import save

    if to_stdout(output):
        sys.stdout.write(text)
    else:
        save(text, fmt, output)
        print(safe(said or f"wrote {output}"), file=sys.stderr)
    return 0


# --- arguments ----------------------------------------------------------------------------------

def add_list_show(actions: argparse._SubParsersAction, parents: Iterable[argparse.ArgumentParser], noun: str, *,
                  list_handler: Callable[[argparse.Namespace], int], show_handler: Callable[[argparse.Namespace], int],
                  show_help: str, show_target_help: str) -> None:
    """``list`` (newest first) and ``show ID`` of stored campaigns, each with ``--json``."""
    parents = [*parents, json_parent()]
    ls = actions.add_parser("list", parents=parents, help=f"stored {noun}s, newest first")
    ls.set_defaults(handler=list_handler)
    show = actions.add_parser("show", parents=parents, help=show_help)
    show.add_argument(noun, help=show_target_help)
    show.set_defaults(handler=show_handler)


def add_report(actions: argparse._SubParsersAction, parents: Iterable[argparse.ArgumentParser], noun: str, *,
               handler: Callable[[argparse.Namespace], int], help: str) -> None:
    """``report ID -o FILE [--title]``: a stored campaign's HTML report."""
    rep = actions.add_parser("report", parents=list(parents), help=help)
    rep.add_argument(noun)
    rep.add_argument("-o", "--output", metavar="FILE", required=True, help="HTML file ('-': standard output)")
    rep.add_argument("--title", help="the report's title")
    rep.set_defaults(handler=handler)
