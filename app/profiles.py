"""Profiles: run configurations as TOML files (load, save, round-trip exact), and the shipped ones."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from app.config import RunConfig
from app.errors import UserError, read_user_text


class ProfileError(UserError):
    """A profile that cannot be used, with a one-line message naming the file and the problem."""


def _key(part: str | int) -> str:
    """A key of the path to a bad value; quoted when a typo put spaces or control characters in
    it, so the message stays one readable line."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _format_validation(path: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(_key(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return f"{path}: invalid profile: " + "; ".join(parts)


def profile_from_toml(text: str, source: str = "<profile>") -> RunConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ProfileError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(source, exc)) from None
    except RecursionError:
        raise ProfileError(f"{source}: invalid profile: values nested too deeply") from None


def profile_to_dict(config: RunConfig) -> dict[str, Any]:
    """TOML has no null: unset (None) values are left out and come back as defaults."""
    return config.model_dump(mode="json", exclude_none=True)


def profile_to_toml(config: RunConfig) -> str:
    return tomli_w.dumps(profile_to_dict(config))


def load_profile(path: str | Path) -> RunConfig:
    path = Path(path)
    return profile_from_toml(read_user_text(path, "profile file", ProfileError), str(path))


def save_profile(config: RunConfig, path: str | Path) -> Path:
    """Write atomically so a crash never leaves half a profile."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(profile_to_toml(config), encoding="utf-8")
    tmp.replace(path)
    return path


def shipped_profiles() -> dict[str, Path]:
    """The profiles that ship with tunebench, by file stem."""
    root = resources.files("profiles")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def resolve_profile(name_or_path: str) -> Path:
    """A path, or the stem of a shipped profile (``cpu-demo``)."""
    if not name_or_path:
        raise ProfileError("the profile name is empty: give a profile file or a shipped profile name")
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
        raise ProfileError(f"{name_or_path}: cannot be a profile file: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if exists:
        return path
    shipped = shipped_profiles()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise ProfileError(f"{name_or_path}: no such profile file or shipped profile "
                       f"(shipped: {', '.join(sorted(shipped))})")
