"""argparse ``type=`` functions with bounds: a value argparse accepts can be used as it is, so a
huge, negative, empty or non-finite argument is a usage error (one line, exit 2), never an
OverflowError or a hang further in."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from app.cost import DEFAULT_HEADROOM, PERCENTILES
from app.urls import BadEndpoint, check_api_key, check_endpoint

MAX_PID = 2**31 - 1  # pid_t
MAX_COUNT = 1_000_000_000
DB_HELP = ("run database: a file, sqlite:///FILE or postgresql://USER@HOST:5432/DATABASE (default: $TUNEBENCH_DB "
           "or runs.db in the user data directory)")


def add_db_argument(parser: argparse.ArgumentParser, default: Any = None, help: str = DB_HELP) -> None:
    """The one ``--db`` option: where runs are stored (``db.schema.store_location`` reads it)."""
    parser.add_argument("--db", metavar="PATH_OR_URL", default=default, help=help)


def db_parent(default: Any = None, help: str = DB_HELP) -> argparse.ArgumentParser:
    """``--db`` as a parent parser."""
    parent = argparse.ArgumentParser(add_help=False)
    add_db_argument(parent, default, help)
    return parent


def json_parent() -> argparse.ArgumentParser:
    """``--json`` (print JSON instead of text) as a parent parser, for the store's listing commands."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON")
    return parent


def add_run_options(parser: argparse.ArgumentParser, *, store_help: str | None) -> None:
    """``--no-telemetry``, ``--no-store`` and ``-v``, the same for every command that launches an
    engine and measures it; ``store_help`` None leaves ``--no-store`` out (a resume always stores)."""
    parser.add_argument("--no-telemetry", action="store_true", help="do not sample GPU/host/engine telemetry")
    if store_help is not None:
        parser.add_argument("--no-store", action="store_true", help=store_help)
    parser.add_argument("-v", "--verbose", action="store_true", help="print the engine log")


def add_price_argument(parser: argparse.ArgumentParser) -> None:
    """``--price NAME=USD_PER_HOUR`` (repeatable), the same for every command that shows a cost;
    ``app.cost.price_table`` checks each entry."""
    parser.add_argument("--price", action="append", metavar="NAME=USD_PER_HOUR",
                        help="your price per GPU-hour, e.g. 'H100=2.49', or per core-hour, 'cpu=0.05' (repeatable; "
                             "over the run's profile [prices] and the shipped, dated list of typical list prices)")


def add_good_slo_argument(parser: argparse.ArgumentParser, measured: str) -> None:
    """``--slo`` where stored runs are priced: the SLO their good output is counted under, over the
    one ``measured`` (e.g. "the runs were") measured under; ``app.cost.comparison_slo`` checks it."""
    parser.add_argument("--slo", help="price the good output: the tokens of the requests that met this SLO, e.g. "
                                      f"'ttft_ms<=500,tpot_ms<=50' (default: the SLO {measured} measured under)")


def bounded_int(minimum: int, maximum: int) -> Callable[[str], int]:
    """A whole number in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected a whole number from {minimum:,} to {maximum:,}, "
                                             f"got {_short(text)}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its message
    return parse


def bounded_float(minimum: float, maximum: float, *, exclusive_minimum: bool = False) -> Callable[[str], float]:
    """A finite number in ``[minimum, maximum]`` (``(minimum, maximum]`` when ``exclusive_minimum``)."""

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        low_ok = value > minimum if exclusive_minimum else value >= minimum
        if not (math.isfinite(value) and low_ok and value <= maximum):
            low = "above" if exclusive_minimum else "from"
            raise argparse.ArgumentTypeError(f"expected a number {low} {minimum:g} up to {maximum:g}, got {_short(text)}")
        return value

    parse.__name__ = "number"
    return parse


def endpoint_url(text: str) -> str:
    """An http(s) endpoint URL (see :func:`app.urls.check_endpoint`)."""
    try:
        return check_endpoint(text)
    except BadEndpoint as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def api_key(text: str) -> str:
    """An API key that fits in an Authorization header."""
    try:
        return check_api_key(text)
    except BadEndpoint as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _short(text: str, limit: int = 24) -> str:
    shown = text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"
    return repr(shown)


endpoint_url.__name__ = "URL"
api_key.__name__ = "API key"


MAX_TOKENS_PER_DAY = 1e18


def add_sizing_arguments(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The traffic, headroom and price options, shared with ``tunebench export --format k8s`` so
    both commands parse and bound them alike (``--slo`` is each command's own: required here,
    optional there). ``defaults=False`` leaves every option None unless given, so a caller can tell
    an option given from its default (the defaults then apply downstream, the same values)."""
    p.add_argument("--percentile", choices=PERCENTILES, default="p99" if defaults else None,
                   help="each SLO bound holds at this percentile of the level (default p99)")
    p.add_argument("--users", type=bounded_int(1, MAX_COUNT), metavar="N", help="concurrent users to serve")
    p.add_argument("--tokens-per-day", type=bounded_float(0.0, MAX_TOKENS_PER_DAY, exclusive_minimum=True),
                   metavar="T", help="output tokens to generate per day")
    p.add_argument("--headroom", type=bounded_float(0.0, 10.0), default=DEFAULT_HEADROOM if defaults else None,
                   help=f"spare capacity on top, as a fraction (default {DEFAULT_HEADROOM:g}: "
                        f"{DEFAULT_HEADROOM * 100:g} percent)")
    add_price_argument(p)
    p.add_argument("--gpu", metavar="NAME", help="the GPU the run used, for a run whose record names none")
