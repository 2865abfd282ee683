"""Errors the user can act on: printed as one line by the CLI and shown as a message by the GUI."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A problem with input or environment, with a plain one-line message."""

    exit_code = 2


class EngineFailed(UserError):
    """The engine failed to start or died; the message is the diagnosis."""

    exit_code = 3


def read_user_text(path: Path, what: str = "file", error: type[UserError] = UserError) -> str:
    """A user-named text file's content, or one line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None
