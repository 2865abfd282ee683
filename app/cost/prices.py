"""Prices: the shipped list of typical list prices (``assets/prices.toml``, dated), the run's
profile prices and the user's ``--price`` on top, and which one priced a figure: a cost from a
default price is an estimate, not a quote, and says so.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from app.errors import UserError
from app.money import check_price, short_text
from db.records import RunDetail
from engine_adapters.gpu_specs import find_gpu_spec

CPU_PRICE_KEYS = ("cpu", "cpu_core")
"""``--price`` names of the per-core-hour price (CPU runs)."""
PRICES_ASSET = "prices.toml"
Unit = Literal["GPU", "core"]
"""What a price is per hour of: a GPU, or a core (a logical CPU) for a CPU run."""


@dataclass(frozen=True)
class Price:
    """The price one figure was computed with, and where it came from."""

    key: str
    """The price list's or the user's name for it ("H100", "cpu")."""
    usd_per_hour: float
    """Per GPU-hour, or per core-hour for a CPU run."""
    unit: Unit
    yours: bool
    as_of: str
    """The default table's date (kept for yours too: it dates the table that was overridden)."""
    from_profile: bool = False
    """From the run's profile (``[prices]``), not from the command or the window."""

    @property
    def source(self) -> str:
        if self.from_profile:
            return "the run's profile price"
        return "your price" if self.yours else f"default price, as of {self.as_of}"

    def text(self) -> str:
        return f"{self.usd_per_hour:,.2f} $/{self.unit}-h ({self.source})"


def parse_price(text: str) -> tuple[str, float]:
    """``'H100=2.49'`` -> ``('H100', 2.49)``; ``'cpu=0.05'`` is the per-core-hour price."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep:
        raise UserError(f"--price {short_text(text)}: expected NAME=USD_PER_HOUR, e.g. --price 'H100=2.49' "
                        "(or 'cpu=0.05' per core-hour)")
    if not name:
        raise UserError(f"--price {short_text(text)}: the GPU name before '=' is empty (e.g. --price 'H100=2.49')")
    return name, check_price(value, f"--price {short_text(name)}")


def _words(name: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", name.lower()))


def price_key_matches(key: str, gpu_name: str) -> bool:
    """Whether a price-list key names this GPU: every word of the key is a word of the name
    ("A100 80GB" and "NVIDIA A100-SXM4-80GB"), or both are the same card in the spec table
    (``engine_adapters.gpu_specs``: "H100 SXM" and "NVIDIA H100 80GB HBM3"). The words rule is
    there because the spec table lists only the cards the planner knows (no A10G) and resolves a
    family ("H100") to one variant, while a price is usually quoted per family."""
    words = _words(key)
    if words and words <= _words(gpu_name):
        return True
    spec = find_gpu_spec(key)
    return spec is not None and spec == find_gpu_spec(gpu_name)


@dataclass(frozen=True)
class PriceTable:
    """The default prices with the user's on top (``with_prices``)."""

    gpu_hour_usd: Mapping[str, float]
    cpu_core_hour_usd: float | None
    as_of: str
    source: str
    your_gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    your_cpu_core_hour_usd: float | None = None
    profile_gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    """The run's profile prices (``[prices]``): under yours, over the defaults (``for_run``)."""
    profile_cpu_core_hour_usd: float | None = None

    def for_run(self, run: RunDetail) -> PriceTable:
        """This table with the prices the run's profile recorded (``RunConfig.prices``) between
        yours and the defaults; a stored price that is not one is refused in one line."""
        stored = (run.config or {}).get("prices") or {}
        if not isinstance(stored, Mapping):
            raise UserError(f"run {run.id} records its prices as {short_text(str(stored))}, not a table")
        gpus: dict[str, float] = {}
        cpu = None
        for name, value in stored.items():
            usd = check_price(value, f"run {run.id}: the price of {short_text(str(name))} in its profile")
            if str(name).lower() in CPU_PRICE_KEYS:
                cpu = usd
            else:
                gpus[str(name)] = usd
        return replace(self, profile_gpu_hour_usd=gpus, profile_cpu_core_hour_usd=cpu)

    def with_prices(self, texts: Iterable[str]) -> PriceTable:
        """This table with ``--price NAME=USD`` entries (the last of a name wins)."""
        gpus = dict(self.your_gpu_hour_usd)
        cpu = self.your_cpu_core_hour_usd
        for text in texts:
            name, usd = parse_price(text)
            if name.lower() in CPU_PRICE_KEYS:
                cpu = usd
            else:
                gpus[name] = usd
        return replace(self, your_gpu_hour_usd=gpus, your_cpu_core_hour_usd=cpu)

    def gpu(self, gpu_name: str) -> Price:
        """The price of one hour of this GPU: yours before the default; of several keys that
        match, the most specific (most words)."""
        layers = ((self.your_gpu_hour_usd, True, False), (self.profile_gpu_hour_usd, True, True),
                  (self.gpu_hour_usd, False, False))
        for table, yours, from_profile in layers:
            keys = [k for k in table if price_key_matches(k, gpu_name)]
            if keys:
                key = max(keys, key=lambda k: len(_words(k)))
                return Price(key, table[key], "GPU", yours, self.as_of, from_profile)
        example = re.sub(r"^nvidia\s+", "", gpu_name.strip(), flags=re.IGNORECASE) or "NAME"
        raise UserError(f"no price for the GPU '{gpu_name}' (it is not in the default price list): pass "
                        f"--price 'NAME=USD_PER_HOUR', e.g. --price '{example}=2.00'")

    def cpu(self) -> Price:
        """The price of one core-hour (a logical CPU, as clouds sell vCPUs)."""
        if self.your_cpu_core_hour_usd is not None:
            return Price("cpu", self.your_cpu_core_hour_usd, "core", True, self.as_of)
        if self.profile_cpu_core_hour_usd is not None:
            return Price("cpu", self.profile_cpu_core_hour_usd, "core", True, self.as_of, True)
        if self.cpu_core_hour_usd is None:
            raise UserError("no per-core price: pass --price 'cpu=USD_PER_CORE_HOUR', e.g. --price 'cpu=0.05'")
        return Price("cpu", self.cpu_core_hour_usd, "core", False, self.as_of)

    def unused(self, used: Price | None) -> list[str]:
        """Your prices that priced nothing (a typo in a name shows up here)."""
        names = [k for k in self.your_gpu_hour_usd
                 if used is None or not (used.yours and not used.from_profile and used.key == k)]
        if self.your_cpu_core_hour_usd is not None and (used is None or used.unit != "core" or used.from_profile):
            names.append("cpu")
        return names


def _price_table(data: Mapping[str, Any], where: str) -> PriceTable:
    as_of, source = data.get("as_of"), data.get("source")
    gpus, cpu = data.get("gpu_hour_usd"), data.get("cpu")
    if not isinstance(as_of, str) or not isinstance(source, str) or not isinstance(gpus, Mapping) \
            or not isinstance(cpu, Mapping):
        raise UserError(f"{where}: needs as_of, source, [gpu_hour_usd] and [cpu]")
    return PriceTable({str(k): check_price(v, f"{where}: gpu_hour_usd.{k}") for k, v in gpus.items()},
                      check_price(cpu.get("core_hour_usd"), f"{where}: cpu.core_hour_usd"), as_of, source)


@lru_cache(maxsize=1)
def default_prices() -> PriceTable:
    """The shipped price list (``assets/prices.toml``)."""
    where = f"the shipped price list assets/{PRICES_ASSET}"
    try:
        data = tomllib.loads((resources.files("assets") / PRICES_ASSET).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{where} cannot be read: {exc}") from None
    return _price_table(data, where)


def price_table(prices: Iterable[str] = ()) -> PriceTable:
    """The default prices with ``--price NAME=USD`` entries on top."""
    return default_prices().with_prices(prices)
