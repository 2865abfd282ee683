"""Profiles: a run configuration as a TOML file, with optional campaign specs over it (load,
save, round-trip exact), and the shipped ones.

A profile is one run (``app.config.RunConfig``, the file's top level) plus campaigns:
``[campaigns.ladder]``, the acceleration ladder over it (``app.ladder.spec``). A file from
before campaigns had their own table keeps its ladder as ``[ladder]``: it loads, with a note.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, Field, ValidationError

from app.config import RunConfig
from app.errors import UserError, read_user_text
from app.ladder.spec import LadderSpec
from engine_adapters.config import StrictModel

OLD_LADDER_KEY = "ladder"
"""Where a profile kept its ladder before campaigns had their own table."""


class Campaigns(StrictModel):
    """The campaigns a profile defines over its run."""

    ladder: LadderSpec | None = Field(None, description="An acceleration ladder over the profile's run "
                                                        "(``tunebench ladder``; app.ladder.spec).")


class Profile(BaseModel):
    """A profile file: its run, its campaigns, and notes on how it was read."""

    run: RunConfig
    campaigns: Campaigns = Field(default_factory=Campaigns)
    notes: list[str] = Field(default_factory=list)

    @property
    def ladder(self) -> LadderSpec | None:
        return self.campaigns.ladder


class ProfileError(UserError):
    """A profile that cannot be used, with a one-line message naming the file and the problem."""


def _key(part: str | int) -> str:
    """A key of the path to a bad value; quoted when a typo put spaces or control characters in
    it, so the message stays one readable line."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _format_validation(path: str, exc: ValidationError, prefix: str = "") -> str:
    parts = []
    for err in exc.errors():
        where = prefix + ".".join(_key(p) for p in err["loc"]) if err["loc"] else prefix.rstrip(".") or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return f"{path}: invalid profile: " + "; ".join(parts)


def read_profile(text: str, source: str = "<profile>") -> Profile:
    """The run and the campaigns of a profile file's text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ProfileError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    campaigns = data.pop("campaigns", {})
    notes = []
    if OLD_LADDER_KEY in data:
        if isinstance(campaigns, dict) and OLD_LADDER_KEY in campaigns:
            raise ProfileError(f"{source}: invalid profile: both [ladder] and [campaigns.ladder]: keep one")
        notes.append(f"{source}: [ladder] is read as [campaigns.ladder], where a profile keeps its ladder now "
                     "(saving the profile writes it there)")
        campaigns = {**(campaigns if isinstance(campaigns, dict) else {}), OLD_LADDER_KEY: data.pop(OLD_LADDER_KEY)}
    run = _validated(RunConfig, data, source, "")
    return Profile(run=run, campaigns=_validated(Campaigns, campaigns, source, "" if notes else "campaigns."),
                   notes=notes)


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], data: Any, source: str, where: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(source, exc, where)) from None
    except RecursionError:
        raise ProfileError(f"{source}: invalid profile: values nested too deeply") from None


def profile_from_toml(text: str, source: str = "<profile>") -> RunConfig:
    """The run of a profile file's text (its campaigns checked, then left aside)."""
    return read_profile(text, source).run


def profile_to_dict(config: RunConfig, ladder: LadderSpec | None = None) -> dict[str, Any]:
    """TOML has no null: unset (None) values are left out and come back as defaults."""
    data = config.model_dump(mode="json", exclude_none=True)
    if ladder is not None:
        data["campaigns"] = {OLD_LADDER_KEY: ladder.model_dump(mode="json", exclude_none=True)}
    return data


def profile_to_toml(config: RunConfig, ladder: LadderSpec | None = None) -> str:
    return tomli_w.dumps(profile_to_dict(config, ladder))


def load_profile_file(path: str | Path) -> Profile:
    path = Path(path)
    return read_profile(read_user_text(path, "profile file", ProfileError), str(path))


def load_profile(path: str | Path) -> RunConfig:
    """The run a profile file describes."""
    return load_profile_file(path).run


def save_profile(config: RunConfig, path: str | Path, ladder: LadderSpec | None = None) -> Path:
    """Write atomically so a crash never leaves half a profile."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(profile_to_toml(config, ladder), encoding="utf-8")
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
