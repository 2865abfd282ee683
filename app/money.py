"""What a price is: a finite number of USD per GPU- or core-hour, above zero and below a typo.
Checked alike wherever a price comes from (``--price``, a profile's ``[prices]``, the settings, the
shipped list), so all of them refuse the same values in the same words."""

from __future__ import annotations

import math
from typing import Any

from app.errors import UserError

MAX_USD_PER_HOUR = 1_000_000.0
"""A price per GPU- or core-hour above this is a typo (and would overflow the figures)."""


def short_text(text: str, limit: int = 40) -> str:
    """``repr`` of a value, cut to ``limit`` characters: a message stays one readable line."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_price(value: Any, what: str) -> float:
    """A price per hour as a float, or one line saying why it is not one (non-numeric, NaN or
    infinite, zero or negative, absurdly large)."""
    if isinstance(value, bool):
        raise UserError(f"{what}: expected a price in USD per hour, got {value!r}")
    try:
        usd = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise UserError(f"{what}: {short_text(str(value))} is not a number (a price in USD per hour, e.g. 2.49)") from None
    if not math.isfinite(usd):
        raise UserError(f"{what}: the price must be a finite number, got {short_text(str(value))}")
    if usd <= 0:
        raise UserError(f"{what}: the price must be above 0 USD per hour, got {usd:g}")
    if usd > MAX_USD_PER_HOUR:
        raise UserError(f"{what}: {usd:g} USD per hour is more than {MAX_USD_PER_HOUR:,.0f}: a typo?")
    return usd


