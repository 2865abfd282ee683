"""``tunebench race A B [--export FILE.gif|FILE.mp4|FILE.png]``: two stored runs' sample requests
replayed side by side at their measured pace (``app.race``), written to a file without a
display; without ``--export``, the race in words. ``tunebench staircase LADDER --export FILE``:
a ladder's staircase as an animation or a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.argtypes import db_parent
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.errors import UserError
from app.export.animation import ANIMATION_SUFFIXES, STILL_SUFFIXES
from app.race import Race, race_of

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
        lines.append(f"{key}: run {side.run_id} '{side.name}', level {side.level_label}: TTFT {side.first_ms:,.0f} ms, "
                     f"{side.total_tokens} tokens, {rate}, finished in {side.finish_ms / 1e3:.2f} s")
    lines.append(race.verdict())
    return lines


def cmd_race(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        race = race_of(store, args.a, args.b, args.level)
    if args.export is None:
        print("\n".join(safe(line) for line in race_lines(race)))
        return 0
    _headless_painter("the race")
    from app.gui.race_view import export_race

    print(safe(f"{export_race(race, args.export)}: {race.verdict()}"))
    return 0


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
                          help="replay two stored runs side by side at their measured pace (one sample request each)")
    race.add_argument("a", metavar="A", help="the first run (id, uid prefix or name)")
    race.add_argument("b", metavar="B", help="the second run")
    race.add_argument("--level", metavar="LABEL", help="the level to race on both sides (default: each run's first "
                      "level with a sample request)")
    race.add_argument("--export", metavar="FILE", type=_export_path, help=EXPORT_HELP)
    race.set_defaults(handler=cmd_race)
    stairs = sub.add_parser("staircase", parents=[db_parent()], help="a stored ladder's staircase as an animation "
                            "or a PNG")
    stairs.add_argument("ladder", metavar="LADDER", help="the ladder (id or name)")
    stairs.add_argument("--export", metavar="FILE", type=_export_path, required=True,
                        help=EXPORT_HELP.replace("the finish as a still", "every step"))
    stairs.set_defaults(handler=cmd_staircase)
