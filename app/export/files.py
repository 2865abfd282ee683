"""Writing an export to a user-named file: one rule for the CLI's ``-o`` and the GUI's Save.

The text goes to a temporary file beside the target, which then replaces it (``os.replace``):
a reader never sees half a script, and a failed write leaves the old file as it was. Only a
regular file (or nothing) is replaced. A named pipe or a device is refused, because writing
there could block forever or replace ``/dev/stdout`` itself; so is a symbolic link, because
replacing the link or the file it points to are both surprising (name the real file). Scripts
are written executable (0755), everything else 0644. Every failure is one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from app.errors import UserError

SCRIPT_MODE = 0o755
FILE_MODE = 0o644
STDOUT = "-"
"""The ``-o`` value that means standard output."""

_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
          (stat.S_ISSOCK, "a socket"))


def _os_message(path: Path, exc: OSError) -> str:
    """One line for a failed write."""
    return f"cannot write {path}: {write_problem(path, exc)}"


def write_problem(path: Path, exc: OSError) -> str:
    """Why writing ``path`` failed, in the words of what the user can change. The error is read by
    its errno; "does not exist" only when the folder really does not (a file system such as /proc
    also answers ENOENT when it refuses to create a file in a folder that exists)."""
    parent = path.parent
    code = exc.errno
    if code == errno.ENAMETOOLONG:
        return "the file name is too long"
    if code == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    if code == errno.EISDIR:
        return "it is a directory; give a file name"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.EROFS:
        return f"{parent} is on a read-only file system"
    if code == errno.ENOENT:
        if not parent.is_dir():
            return f"its folder does not exist ({parent})"
        return f"{parent} does not take new files (its file system refused to create one); choose another directory"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left ({exc.strerror or exc})"
    return str(exc.strerror or exc)


def check_target(path: Path) -> None:
    """Refuse what must not be replaced (module docstring); a missing file is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:  # ENOTDIR, ENAMETOOLONG, EACCES on a parent
        raise UserError(_os_message(path, exc)) from None
    if stat.S_ISLNK(info.st_mode):
        raise UserError(f"{path} is a symbolic link: give the path of a regular file (tunebench does not replace "
                        f"links or write through them){_stdout_hint(path)}")
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path} is a directory: give a file name")
    for is_kind, kind in _KINDS:
        if is_kind(info.st_mode):
            raise UserError(f"{path} is {kind}, not a regular file: refusing to write to it{_stdout_hint(path)}")


def check_folder(path: Path) -> None:
    """Refuse, before the work, a path whose folder cannot take the file: missing, not a folder,
    read-only, not writable, or (what access() cannot see for root) a file system that makes no
    new files, such as /proc. A temporary file is made and removed there to be sure."""
    parent = path.parent
    try:
        folder = os.stat(parent)
    except OSError as exc:
        raise UserError(_os_message(path, exc)) from None
    if not stat.S_ISDIR(folder.st_mode):
        raise UserError(f"cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {path}: cannot create files in {parent} (permission denied)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".tunebench-", suffix=".probe", dir=parent)
    except OSError as exc:
        raise UserError(_os_message(path, exc)) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _stdout_hint(path: Path) -> str:
    return f" (use -o {STDOUT} for standard output)" if str(path).startswith(("/dev/", "/proc/")) else ""


def write_atomic(path: str | Path, text: str, *, executable: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` by replacing it whole; returns the path written."""
    path = Path(path).expanduser()
    check_target(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tunebench-", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, SCRIPT_MODE if executable else FILE_MODE)
        check_target(path)  # it may have become a link or a pipe meanwhile
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise UserError(_os_message(path, exc)) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # the write already failed; its message is the one that matters
    return path
