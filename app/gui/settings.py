"""The workbench's own small memory: recent profiles and models (a JSON file in the user's
config directory). Read and written from workers, never on the GUI thread."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from engine_adapters.paths import config_dir

MAX_RECENT = 10
MAX_STARTUPS = 50


class GuiSettings(BaseModel):
    recent_profiles: list[str] = Field(default_factory=list)
    recent_models: list[str] = Field(default_factory=list)
    prices: list[str] = Field(default_factory=list)
    """Your ``NAME=USD_PER_HOUR`` prices (``--price``'s form), over the shipped list: Compare's
    costs and the Capacity boxes use them."""
    startup_s: dict[str, float] = Field(default_factory=dict)
    """Seconds the last start of each engine configuration took (key: a hash of engine and
    features): how long a restart will take, shown while it starts."""
    store_location: str = ""
    """The run database chosen in Run database… (a path or a PostgreSQL URL); empty: ``--db``,
    ``TUNEBENCH_DB`` or the default file. An explicit ``--db`` wins over it."""
    author: str = ""
    """The name runs recorded here carry in a shared store; empty: the OS user."""
    cluster_address: str = ""
    """The Cluster box's Ray address; empty: runs on this machine."""
    cluster_trials_at_once: int = 0
    """The Cluster box's trials at once; 0: as many as the cluster's free resources hold."""

    def remember(self, kind: str, value: str) -> GuiSettings:
        items = [value, *[v for v in getattr(self, kind) if v != value]][:MAX_RECENT]
        return self.model_copy(update={kind: items})

    def with_startup(self, key: str, seconds: float) -> GuiSettings:
        kept = dict(list(self.startup_s.items())[-(MAX_STARTUPS - 1):])
        kept.pop(key, None)
        return self.model_copy(update={"startup_s": {**kept, key: round(seconds, 1)}})


def settings_path() -> Path:
    return config_dir() / "gui.json"


def load_settings(path: Path | None = None) -> GuiSettings:
    """A missing or damaged file gives defaults (the damaged one is kept aside, not lost)."""
    path = path or settings_path()
    try:
        return GuiSettings.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return GuiSettings()
    except (OSError, ValueError, ValidationError, json.JSONDecodeError):
        path.replace(path.with_suffix(".json.bad"))
        return GuiSettings()


def save_settings(settings: GuiSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # For its owner only from the first byte: the run database's URL may hold a password (~/.pgpass too).
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
        handle.write(settings.model_dump_json(indent=2))
    tmp.replace(path)
