"""Per-user directories (platformdirs), overridable by environment for tests and CI."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from engine_adapters.errors import TunebenchError

APP_NAME = "tunebench"


class UnusableDirectory(TunebenchError):
    """A per-user directory that cannot be created: one line naming it and the variable that moves it."""


def _dir(env_var: str, default: str) -> Path:
    path = Path(os.environ.get(env_var) or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # read-only, a file in the way, a name too long, a NUL
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UnusableDirectory(f"cannot create {path}: {reason} (set {env_var} to a writable folder)") from None
    return path


def cache_dir() -> Path:
    """Large, re-creatable things: engine venvs, the demo model, flag caches."""
    return _dir("TUNEBENCH_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME))


def state_dir() -> Path:
    """Small live state: the registry of engines this user's tunebench processes started."""
    return _dir("TUNEBENCH_STATE_DIR", platformdirs.user_state_dir(APP_NAME))


def data_dir() -> Path:
    """Durable user data: the run database lives here by default."""
    return _dir("TUNEBENCH_DATA_DIR", platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """User settings: recent models and profiles."""
    return _dir("TUNEBENCH_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME))
