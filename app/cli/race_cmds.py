"""``tunebench race A B [--export FILE.gif|FILE.mp4|FILE.png]``: two stored runs' sample requests
replayed side by side at their measured pace (``app.race``), written to a file without a
display; without ``--export``, the race in words. ``tunebench race --live PROFILE_A PROFILE_B``:
the two configurations run at once, each on its own engine (on a Ray cluster with ``--cluster``),
their sample requests raced as they stream (``app.race.LiveRace``), then the stored runs' race.
``tunebench staircase LADDER --export FILE``: a ladder's staircase as an animation or a PNG."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from app.bus import Event
from app.cli.argtypes import add_run_options, db_parent
from app.cli.campaign_cmds import EXIT_CANCELLED, EXIT_FAILED
from app.cli.fleet_cmds import add_cluster_options, open_fleet
from app.cli.foreground import open_recorder, run_in_foreground
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.errors import UserError
from app.events import LogLine
from app.export.animation import ANIMATION_SUFFIXES, STILL_SUFFIXES
from app.profiles import ProfileError, load_profile, resolve_profile
from app.race import LIVE_RACE_KINDS, LiveRace, Race, race_of

EXPORT_HELP = (f"write it to FILE ({', '.join(ANIMATION_SUFFIXES)}: an animation at 20 fps; "
               f"{', '.join(STILL_SUFFIXES)}: the finish as a still)")


def _export_path(value: str) -> Path:
    path = Path(value).expanduser()
    if path.suffix.lower() not in (*ANIMATION_SUFFIXES, *STILL_SUFFIXES):
        raise argparse.ArgumentTypeError(f"{value}: the file must end in "
                                         f"{', '.join((*ANIMATION_SUFFIXES, *STILL_SUFFIXES))}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: no folder {path.parent}")
    return path


def _headless_painter(what: str) -> None:
    """Qt without a display, to paint ``what`` into a file; a missing gui extra is said in one line."""
    try:
        from app.gui.race_view import headless_app
    except ImportError as exc:  # pragma: no cover - the gui extra is missing
        raise UserError(f"painting {what} needs PySide6 (pip install 'tunebench[gui]'): {exc}") from None
    headless_app()


def race_lines(race: Race) -> list[str]:
    lines = [race.title()]
    for key, side in (("A", race.a), ("B", race.b)):
        end = side.state_at(race.duration_ms)
        rate = f"{end.tok_per_s:,.1f} tok/s" if end.tok_per_s is not None else "no rate (one token)"
        run = f"run {side.run_id} " if side.run_id is not None else ""
        lines.append(f"{key}: {run}'{side.name}', level {side.level_label}: TTFT {side.first_ms:,.0f} ms, "
                     f"{side.total_tokens} tokens, {rate}, finished in {side.finish_ms / 1e3:.2f} s")
    lines.append(race.verdict())
    return lines


def cmd_race(args: argparse.Namespace) -> int:
    if args.live:
        return cmd_race_live(args)
    given = [flag for flag, value in (("--cluster", args.cluster), ("--parallel", args.parallel),
                                      ("--skip-bad-nodes", args.skip_bad_nodes), ("--trial-resource", args.trial_resource),
                                      ("--no-store", args.no_store), ("--no-telemetry", args.no_telemetry)) if value]
    if given:
        raise UserError(f"{', '.join(given)}: only for a live race's runs (race --live PROFILE_A PROFILE_B)")
    with open_store(args) as store:
        race = race_of(store, args.a, args.b, args.level)
    if args.export is None:
        print("\n".join(safe(line) for line in race_lines(race)))
        return 0
    _headless_painter("the race")
    from app.gui.race_view import export_race

    print(safe(f"{export_race(race, args.export)}: {race.verdict()}"))
    return 0


def _live_line(live: LiveRace) -> str:
    clocks = live.clocks_ms()
    tokens = live.tokens()
    return "live: " + "  ·  ".join(
        f"{key} {tokens[key]} tokens, {clocks[k] / 1e3:.2f} s" + (" (finished)" if side.ended else "")
        for k, (key, side) in enumerate(live.sides.items()))


def cmd_race_live(args: argparse.Namespace) -> int:
    """Both configurations at once, their sample requests followed live; then their race as
    stored (the same one ``tunebench race A B`` replays), or exported with ``--export``."""
    try:
        configs = [load_profile(resolve_profile(p)) for p in (args.a, args.b)]
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    where = open_fleet(args, configs[0])
    if where.fleet is not None and where.parallel < 2:
        raise UserError(f"the cluster holds {where.parallel} trial at once: a live race needs both at once "
                        "(give --parallel 2, or free a node)")
    from app.bus import Bus
    from app.race_live import run_live_race

    bus = Bus()
    sub = bus.subscribe(kinds=(*LIVE_RACE_KINDS, LogLine))
    recorder = open_recorder(bus, args)
    live = LiveRace(configs[0].name, configs[1].name)
    cancel = threading.Event()
    tty = sys.stdout.isatty()
    said: dict[str, bool] = {}

    def handle(event: Event) -> None:
        p = event.payload
        if isinstance(p, LogLine):
            if args.verbose:
                print(safe(p.line))
            return
        if not live.feed(event):
            return
        if tty:
            sys.stdout.write("\r\x1b[K" + safe(_live_line(live)))
            sys.stdout.flush()
            return
        for key, side in live.sides.items():  # a pipe: a line as each side starts and ends
            for what, now in (("streaming", bool(side.sample["t_ms"])), ("ended", side.ended)):
                if now and not said.get(key + what):
                    said[key + what] = True
                    print(safe(f"{key} '{side.name}': sample request {what}"
                               + (f" ({side.failed})" if what == "ended" and side.failed else "")))

    def work() -> object:
        return run_live_race(configs[0], configs[1], lambda slot_bus: slot_bus.attach(sub), cancel,
                             recorder=recorder, fleet=where.fleet, telemetry=not args.no_telemetry)

    print(safe(f"live race: A '{configs[0].name}' and B '{configs[1].name}' run at once, each on its own engine"
               + (f" on the cluster at {where.address}" if where.address else " on this machine")))
    outcome = run_in_foreground(work, sub, handle, cancel, name="tunebench-race-live", recorder=recorder)
    if tty:
        print()
    from app.race_live import LiveRaceResult

    assert isinstance(outcome, LiveRaceResult)
    for reason in outcome.reasons():
        print(safe(f"tunebench: {reason}"), file=sys.stderr)
    race = live.replay()
    id_a, id_b = outcome.stored_ids
    if recorder is not None and id_a is not None and id_b is not None and race is not None:
        with open_store(args) as store:
            race = race_of(store, id_a, id_b)  # the race as stored: what was shown live
        print(safe(f"stored as runs {id_a} and {id_b} (tunebench race {id_a} {id_b} replays it)"))
    if race is None:
        if cancel.is_set():
            return EXIT_CANCELLED
        raise UserError("the live race did not finish: " + ("; ".join(outcome.reasons()) or "its runs ended first"))
    if args.export is None:
        print("\n".join(safe(line) for line in race_lines(race)))
    else:
        _headless_painter("the race")
        from app.gui.race_view import export_race

        print(safe(f"{export_race(race, args.export)}: {race.verdict()}"))
    return 0 if outcome.completed else EXIT_CANCELLED if cancel.is_set() else EXIT_FAILED


def cmd_staircase(args: argparse.Namespace) -> int:
    from app.ladder.stored import load_ladder

    with open_store(args) as store:
        state = load_ladder(store, args.ladder).state
    _headless_painter("the staircase")
    from app.gui.staircase_export import export_staircase

    print(safe(f"{export_staircase(state, args.export)}: ladder {state.ladder_id}, {len(state.rows)} steps"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    race = sub.add_parser("race", parents=[db_parent()],
                          help="replay two stored runs side by side at their measured pace (one sample request each); "
                               "with --live, run two profiles at once and race them live")
    race.add_argument("a", metavar="A", help="the first run (id, uid prefix or name); with --live, a profile")
    race.add_argument("b", metavar="B", help="the second run; with --live, a profile")
    race.add_argument("--live", action="store_true",
                      help="A and B are profiles: run both at once, each on its own engine (on this machine: both "
                           "must fit in it together; with --cluster, each a trial on the cluster), and race their "
                           "sample requests as they stream; then the stored race")
    race.add_argument("--level", metavar="LABEL", help="the level to race on both sides (default: each run's first "
                      "level with a sample request)")
    race.add_argument("--export", metavar="FILE", type=_export_path, help=EXPORT_HELP)
    add_run_options(race, store_help="with --live: do not store the two runs (the race is then the live one's)")
    add_cluster_options(race)
    race.set_defaults(handler=cmd_race)
    stairs = sub.add_parser("staircase", parents=[db_parent()], help="a stored ladder's staircase as an animation "
                            "or a PNG")
    stairs.add_argument("ladder", metavar="LADDER", help="the ladder (id or name)")
    stairs.add_argument("--export", metavar="FILE", type=_export_path, required=True,
                        help=EXPORT_HELP.replace("the finish as a still", "every step"))
    stairs.set_defaults(handler=cmd_staircase)
