"""``tunebench gui [PROFILE]``: open the Qt workbench (``make run``)."""

from __future__ import annotations

import argparse

from app.cli.argtypes import DB_HELP, add_db_argument


def cmd_gui(args: argparse.Namespace) -> int:
    from app.gui import main  # Qt is imported only when the workbench is asked for

    return main(args.profile, db_path=args.db)


def register(sub: argparse._SubParsersAction) -> None:
    gui = sub.add_parser("gui", help="open the workbench (Qt): configure, run, watch, compare, export")
    gui.add_argument("profile", nargs="?", default="cpu-demo",
                     help="profile file or shipped profile name to open (default: cpu-demo)")
    add_db_argument(gui, help=DB_HELP.replace("(default: ", "(default: the one chosen in the window's Run database…, "))
    gui.set_defaults(handler=cmd_gui)
