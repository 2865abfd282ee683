"""Errors the user can act on: printed as one line by the CLI and shown as a message by the GUI.
Both derive from :class:`engine_adapters.errors.TunebenchError`, the root the CLI and the GUI catch."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from engine_adapters.errors import EXIT_ENGINE_FAILED, EXIT_INPUT, TunebenchError


class UserError(TunebenchError):
    """A problem with input or environment, with a plain one-line message."""

    exit_code = EXIT_INPUT


class EngineFailed(UserError):
    """The engine failed to start or died; the message is the diagnosis. A ``UserError`` too, so
    code that reports any user-facing failure catches it."""

    exit_code = EXIT_ENGINE_FAILED


MAX_USER_FILE_BYTES = 64 * 2**20
"""Largest profile, import or dataset file read whole into memory."""
READ_CHUNK_BYTES = 32 * 2**20
"""What one read takes before ``between_chunks`` is asked (a fraction of a second off a slow disk)."""

_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def read_user_text(path: Path, what: str = "file", error: type[UserError] = UserError,
                   max_bytes: int = MAX_USER_FILE_BYTES, between_chunks: Callable[[], None] | None = None) -> str:
    """A user-named text file's content, or one line saying why it cannot be read.

    Only regular files, and at most ``max_bytes``: a named pipe would block forever and a device
    never ends. Opened non-blocking, so even opening a pipe with no writer returns at once.
    ``between_chunks`` is called before each read of READ_CHUNK_BYTES; what it raises (a cancel)
    ends the read and goes to the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise error(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        info = os.fstat(fd)
        for test, kind in _NOT_REGULAR:
            if test(info.st_mode):
                raise error(f"{path}: is {kind}, not a {what}")
        if info.st_size > max_bytes:
            raise error(f"{path}: {info.st_size:,} bytes; a {what} may have at most {max_bytes:,}")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as handle:
            if between_chunks is None:
                data: bytes | bytearray = handle.read(max_bytes + 1)
            else:
                data = bytearray()
                while len(data) <= max_bytes:
                    between_chunks()
                    chunk = handle.read(min(READ_CHUNK_BYTES, max_bytes + 1 - len(data)))
                    if not chunk:
                        break
                    data += chunk
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path}: more than {max_bytes:,} bytes; a {what} may have at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read: not UTF-8 text (at byte {exc.start})") from None
