"""The engine's watchdog: a small process per engine that stops the engine's process group when
the tunebench process that started it dies, however it dies (SIGKILL, a crash, the OOM killer).

It holds the read end of a pipe whose only write end lives in tunebench. The kernel closes that
end when tunebench exits, so the watchdog reads end-of-file at once; it then ends the engine's
group (SIGINT, SIGTERM, SIGKILL) unless it is already gone, and removes the engine's registry
entry. On a normal stop tunebench ends the engine first and then closes the pipe, and the
watchdog finds nothing left to do. It runs in a session of its own, so a Ctrl-C or hang-up aimed
at tunebench's terminal does not take it down before it has done its work. The registry (see
``launcher.reap_orphans``) remains the second line, for a watchdog killed along with tunebench.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from engine_adapters.process_group import group_members, stop_group

WATCHDOG_GRACE_S = (10.0, 5.0, 5.0)  # after SIGINT, after SIGTERM, after SIGKILL


class Watchdog:
    """tunebench's side: the running watchdog process and the pipe end that keeps it waiting."""

    def __init__(self, pgid: int, create_time: float, record_path: Path | None = None,
                 grace_s: tuple[float, float, float] = WATCHDOG_GRACE_S) -> None:
        read_fd, write_fd = os.pipe()  # both ends close-on-exec: no other child inherits them
        self._write_fd: int | None = write_fd
        package_parent = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "engine_adapters.watchdog", "--pgid", str(pgid), "--create-time", repr(create_time),
                "--grace", ",".join(str(g) for g in grace_s)]
        if record_path is not None:
            argv += ["--record", str(record_path)]
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                argv, stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                start_new_session=True)
        except OSError:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self, timeout_s: float = 5.0) -> None:
        """The engine is stopped (or gone): let the watchdog finish, and reap it."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tunebench-watchdog", description=__doc__)
    parser.add_argument("--pgid", type=int, required=True)
    parser.add_argument("--create-time", type=float, required=True,
                        help="the engine leader's creation time: guards against a reused group id")
    parser.add_argument("--record", type=Path, help="the engine's registry entry, removed once it is stopped")
    parser.add_argument("--grace", default=",".join(str(g) for g in WATCHDOG_GRACE_S),
                        help="seconds to wait after SIGINT, SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    first, second, third = (float(part) for part in args.grace.split(","))
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    while stdin.read(4096):  # nothing is ever written: this returns b"" when tunebench's end closes
        pass
    if group_members(args.pgid, not_before=args.create_time):
        stop_group(args.pgid, (first, second, third), not_before=args.create_time)
    if args.record is not None:
        args.record.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
