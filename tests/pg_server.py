"""Throwaway PostgreSQL servers for the test suite.

``start_pg_server(base_dir)`` runs ``initdb`` into ``base_dir/pgdata`` and starts a postmaster
that listens on 127.0.0.1 only (a free port, no Unix socket), trusts the role ``tb`` and runs
with ``fsync=off`` (:data:`TEST_DURABILITY`; a benchmark asks for ``crash_safe``): a server for
tests, never for data anyone keeps. initdb and start to ready take about a second (a restart
~0.1 s), so a test module shares one server (a module- or session-scoped fixture) and isolates
its tests with ``create_database()``::

    @pytest.fixture(scope="module")
    def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
        with start_pg_server(tmp_path_factory.mktemp("pg")) as server:
            yield server

Running as root: ``initdb`` refuses to, so when the euid is 0 every server binary runs as the OS
user ``postgres`` (through ``setpriv``, else ``runuser``; always an argv list, never a shell).
The server's files then live in a directory of ``postgres``'s own under the system's temporary
directory (``tunebench-pg-*``), and ``base_dir/pgdata`` and ``base_dir/postgres.log`` are links to
them: pytest's ``/tmp/pytest-of-root`` is 0700, and every pytest session that starts resets it to
0700, which would cut a running server's way to a data directory under it (its next checkpoint
opens files by their absolute path, fails, and the server shuts down). ``close()`` removes that
directory; one left by a test process that was killed is removed by the next server started.

A server is never left running:

- ``stop()`` is idempotent; a fixture calls ``close()`` (a stop, then its files removed) on
  teardown, and ``atexit`` calls it for any server still open when the interpreter exits normally;
- the postmaster is a direct child of the process that started it (not daemonised by
  ``pg_ctl start``), with a parent-death signal (``setpriv --pdeathsig INT``): if the test
  process dies without cleaning up (SIGKILL, a crash, SIGTERM, which skips ``atexit``) the
  kernel sends the postmaster SIGINT, its *fast shutdown*. The signal follows the *thread*
  that spawned it: start servers from a thread that lives as long as the server (pytest's main
  thread, as fixtures do), never from a short-lived worker thread. Without ``setpriv`` (not
  util-linux) there is no parent-death signal, and only ``stop()``/``atexit`` remain.
- ``data_dir/postmaster.pid`` holds the postmaster's pid, so a stray server can also be stopped
  by hand: ``runuser -u postgres -- pg_ctl stop -D DATA_DIR -m fast``.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Final
from urllib.parse import quote

import psycopg
from psycopg import sql

from engine_adapters.launcher import free_port

HOST: Final = "127.0.0.1"
USER: Final = "tb"
INSTALL_COMMAND: Final = "apt-get install postgresql"
PG_LIB_ROOT: Path = Path("/usr/lib/postgresql")  # Debian/Ubuntu: /usr/lib/postgresql/<major>/bin
SERVER_OS_USER: Final = "postgres"  # who runs the server binaries when the tests run as root
REQUIRED_BINARIES: Final = ("initdb", "pg_ctl", "postgres")
STOP_MODES: Final = ("smart", "fast", "immediate")
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60
_PORT_ATTEMPTS: Final = 5
_PORT_CLASH: Final = "Address already in use"
_NO_ACCESS: Final = "Permission denied"
_ACCESS_ATTEMPTS: Final = 3
_SERVER_SETTINGS: Final = (
    f"listen_addresses={HOST}",
    "unix_socket_directories=",  # TCP on 127.0.0.1 only; also no socket-path length limit
)
TEST_DURABILITY: Final = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
"""A test server's (the default): nothing here needs to survive a crash of the machine, and a
power loss may corrupt the cluster."""
CRASH_SAFE_DURABILITY: Final = ("fsync=on", "synchronous_commit=off", "full_page_writes=on")
"""A benchmark's, the level of tunebench's SQLite store (WAL, ``synchronous=NORMAL``): a power
loss may lose the last transactions committed, never corrupts the database."""
# What postmaster does on each signal, for when pg_ctl cannot deliver the stop itself.
_STOP_SIGNALS: Final = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class PgServerMissing(RuntimeError):
    """The PostgreSQL server binaries are not installed. Tests fail with this, never skip."""


def find_pg_bin_dir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` of one installation: that of
    ``initdb`` on PATH (its symlink resolved), else the newest ``/usr/lib/postgresql/*/bin``."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates += [Path(on_path).resolve().parent, Path(on_path).parent]
    candidates += _versioned_bin_dirs(PG_LIB_ROOT)
    best_missing: list[str] = list(REQUIRED_BINARIES)
    for directory in dict.fromkeys(candidates):  # de-duplicated, order kept
        missing = [name for name in REQUIRED_BINARIES if not _is_executable(directory / name)]
        if not missing:
            return directory
        if len(missing) < len(best_missing):
            best_missing = missing
    raise PgServerMissing(
        f"PostgreSQL server binaries missing: {', '.join(best_missing)} (looked on PATH and in "
        f"{PG_LIB_ROOT}/*/bin). Install them with `{INSTALL_COMMAND}` (Debian/Ubuntu)."
    )


def _versioned_bin_dirs(root: Path) -> list[Path]:
    """``root/<version>/bin``, newest version first."""
    found: list[tuple[tuple[int, ...], Path]] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if re.fullmatch(r"\d+(\.\d+)*", entry.name) and (entry / "bin").is_dir():
            found.append((tuple(int(part) for part in entry.name.split(".")), entry / "bin"))
    return [path for _, path in sorted(found, reverse=True)]


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _free_port() -> int:
    """Picked where engines' ports are, below the ephemeral range: the server is stopped and started
    again on its port, and no outgoing connection may take that port as its source in between."""
    return free_port(HOST)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _server_account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        raise PgServerMissing(
            f"running as root, the server must run as the OS user {SERVER_OS_USER!r}, which does not "
            f"exist. `{INSTALL_COMMAND}` (Debian/Ubuntu) creates it."
        ) from None


def _as_server_user(argv: list[str], *, parent_death_signal: bool = False) -> list[str]:
    """``argv`` to run as the server's OS user (``postgres`` when we are root, else ourselves);
    with ``parent_death_signal`` the process gets SIGINT when the calling thread dies."""
    setpriv = shutil.which("setpriv")
    death = ["--pdeathsig", "INT"] if parent_death_signal else []
    if not _running_as_root():
        return [setpriv, *death, "--", *argv] if setpriv and death else argv
    account = _server_account()
    if setpriv is not None:
        ids = ["--reuid", str(account.pw_uid), "--regid", str(account.pw_gid), "--init-groups"]
        return [setpriv, *ids, *death, "--", *argv]
    runuser = shutil.which("runuser")
    if runuser is not None:
        return [runuser, "-u", SERVER_OS_USER, "--", *argv]
    raise PgServerMissing(
        "running as root, the server binaries must run as 'postgres' through setpriv or runuser "
        "(util-linux), and neither is on PATH"
    )


def _server_env() -> dict[str, str]:
    """Our environment without libpq/PostgreSQL settings (PGDATA, PGPORT, ...) that could redirect
    a tool, and with a locale every system has."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _let_server_user_reach(directory: Path) -> None:
    """As root: let the server's OS user traverse every directory from ``/`` to ``directory``
    (adds ``o+x`` where it has no search permission; never read or write). No-op otherwise."""
    if not _running_as_root():
        return
    account = _server_account()
    uid, gid = account.pw_uid, account.pw_gid
    for path in [directory, *directory.parents]:
        st = path.stat()
        if st.st_uid == uid and st.st_mode & stat.S_IXUSR:
            continue
        if st.st_gid == gid and st.st_mode & stat.S_IXGRP:
            continue
        if not st.st_mode & stat.S_IXOTH:
            os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


class _StartFailed(RuntimeError):
    def __init__(self, message: str, *, port_clash: bool, no_access: bool) -> None:
        super().__init__(message)
        self.port_clash = port_clash
        self.no_access = no_access


class PgServer:
    """A running throwaway server (built by ``start_pg_server``)."""

    host: str
    port: int
    user: str
    data_dir: Path

    def __init__(self, *, bin_dir: Path, data_dir: Path, port: int, log_file: Path,
                 home: Path | None = None, durability: tuple[str, ...] = TEST_DURABILITY, host: str = HOST,
                 netns: str | None = None) -> None:
        self.host = host
        self.durability = durability
        """The settings that decide what survives a crash (:data:`TEST_DURABILITY` or
        :data:`CRASH_SAFE_DURABILITY`)."""
        self.netns = netns
        """The network namespace it runs and listens in (tests/netns_hosts.py); None: this one."""
        self.port = port
        self.user = USER
        self.data_dir = data_dir
        self.bin_dir = bin_dir
        self.log_file = log_file
        self.home = home
        """A directory of the server's own (as root), removed by :meth:`close`."""
        self.links: list[Path] = []
        """The links to its files (``base_dir/pgdata``, ``base_dir/postgres.log``)."""
        self._process: subprocess.Popen[bytes] | None = None
        atexit.register(self._stop_at_exit)

    def __repr__(self) -> str:
        return f"PgServer({self.host}:{self.port}, data_dir={str(self.data_dir)!r}, running={self.running})"

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and remove the directory of its own, if it has one: its log is kept, in
        place of the link to it."""
        self.stop()
        if self.home is None:
            return
        for link in self.links:
            if link.is_symlink():
                target = link.resolve()
                link.unlink()
                if target == self.log_file and target.exists():
                    shutil.copyfile(target, link)
        shutil.rmtree(self.home, ignore_errors=True)
        self.home = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while running, from ``data_dir/postmaster.pid``."""
        lines = self._postmaster_lines() if self.running else []
        return int(lines[0]) if lines and lines[0].strip().isdigit() else None

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        """The SQLAlchemy URL of ``database``: ``postgresql+psycopg://tb@127.0.0.1:PORT/DB``. The
        server trusts every connection, so a password is accepted and ignored."""
        auth = self.user if password is None else f"{self.user}:{quote(password, safe='')}"
        return f"postgresql+psycopg://{auth}@{self.host}:{self.port}/{quote(database, safe='')}"

    def create_database(self, name: str | None = None) -> str:
        """``CREATE DATABASE`` (a fresh unique name when ``name`` is None); its SQLAlchemy URL."""
        name = name if name is not None else f"tb_test_{uuid.uuid4().hex[:12]}"
        with self._connect("postgres") as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` (autocommit; several statements allowed) and return the rows of every result,
        like ``psql -At``: one line a row, columns joined by tabs, NULL as the empty string."""
        lines: list[str] = []
        with self._connect(database) as conn:
            cursor = conn.execute(sql)  # the tests' own SQL, never outside input
            while True:
                if cursor.description is not None:
                    for row in cursor.fetchall():
                        lines.append("\t".join("" if value is None else str(value) for value in row))
                if not cursor.nextset():
                    break
        return "\n".join(lines)

    def start(self) -> None:
        """Start the server (again) on the same port and data directory; a no-op while running.
        Raises ``RuntimeError`` when it does not get ready (e.g. something else took the port)."""
        if self.running:
            return
        for attempt in range(_ACCESS_ATTEMPTS):
            _let_server_user_reach(self.data_dir.parent)
            try:
                self._spawn()
                return
            except _StartFailed as exc:
                if not exc.no_access or attempt == _ACCESS_ATTEMPTS - 1:
                    raise

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (smart, fast or immediate) as the server's OS user, and reap the
        postmaster; signals it directly should pg_ctl fail. A no-op when not running."""
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode must be one of {STOP_MODES}, not {mode!r}")
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _let_server_user_reach(self.data_dir.parent)
            result = subprocess.run(
                _as_server_user(self._pg_ctl_stop_argv(mode)),
                capture_output=True, text=True, cwd="/", env=_server_env(), check=False,
            )
            if result.returncode != 0 and process.poll() is None:
                process.send_signal(_STOP_SIGNALS[mode])
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None

    def _pg_ctl_stop_argv(self, mode: str) -> list[str]:
        return [str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", mode,
                "-w", "-t", str(STOP_TIMEOUT_S)]

    def _stop_at_exit(self) -> None:
        try:
            self.close()
        except Exception:  # at exit there is nobody left to tell
            if self._process is not None and self._process.poll() is None:
                self._process.kill()

    def _connect(self, database: str) -> psycopg.Connection[tuple[object, ...]]:
        def connect() -> psycopg.Connection[tuple[object, ...]]:
            return psycopg.connect(
                host=self.host, port=self.port, user=self.user, dbname=database, autocommit=True,
                connect_timeout=10, sslmode="disable", gssencmode="disable",
            )

        if self.netns is None:
            return connect()
        from tests.netns_hosts import in_netns  # its socket is made in the server's namespace

        return in_netns(self.netns, connect)

    def _spawn(self) -> None:
        """Run the postmaster in the foreground as our child and wait until it takes connections."""
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for setting in (*_SERVER_SETTINGS, *self.durability):
            argv += ["-c", setting]
        argv += ["-c", f"listen_addresses={self.host}"]  # the last one given wins
        command = _as_server_user(argv, parent_death_signal=True)
        # setpriv (or nothing) execs postgres: our child is the postmaster; runuser forks it.
        postmaster_pid_known = Path(command[0]).name != "runuser"
        if self.netns is not None:  # `ip netns exec` execs its command too
            command = ["ip", "netns", "exec", self.netns, *command]
        with open(self.log_file, "ab") as log:
            log_start = log.tell()
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                env=_server_env(),
                start_new_session=True,  # a Ctrl-C meant for pytest reaches the server via stop()
            )
        self._process = process
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error = ""
        while True:
            if process.poll() is not None:
                self._process = None
                text = self._log_since(log_start)
                raise _StartFailed(
                    f"postgres exited with {process.returncode} before taking connections on "
                    f"{self.host}:{self.port}; its log ({self.log_file}):\n{text}",
                    port_clash=_PORT_CLASH in text,
                    no_access=_NO_ACCESS in text,
                )
            # Connect only once postmaster.pid says "ready": a connection to a port that someone
            # else listens on would wait for its connect_timeout, not fail at once.
            status = self._postmaster_status(process.pid if postmaster_pid_known else None)
            if status == "ready":
                try:
                    with self._connect("postgres"):
                        return
                except psycopg.OperationalError as exc:
                    last_error = str(exc).strip()
            else:
                last_error = f"postmaster.pid says {status!r}"
            if time.monotonic() > deadline:
                self.stop("immediate")
                raise RuntimeError(
                    f"postgres took no connection on {self.host}:{self.port} within {START_TIMEOUT_S:.0f} s "
                    f"(last error: {last_error}); its log ({self.log_file}):\n{self._log_since(log_start)}"
                )
            time.sleep(0.02)

    def _postmaster_lines(self) -> list[str]:
        try:
            return (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return []

    def _postmaster_status(self, pid: int | None) -> str:
        """Line 8 of postmaster.pid ("starting", "ready", ...) when the file is that of the
        postmaster ``pid`` (any, when None) on our port; else ""."""
        lines = self._postmaster_lines()
        if len(lines) < 8 or lines[3].strip() != str(self.port):
            return ""
        if pid is not None and lines[0].strip() != str(pid):
            return ""
        return lines[7].strip()

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"


HOME_PREFIX: Final = "tunebench-pg-"
OWNER_FILE: Final = "owner-pid"


def _own_home(base_dir: Path) -> Path:
    """As root: a directory of the server's OS user for its files, outside pytest's temporary root
    (see the module's note), linked from ``base_dir``; first, those of killed test processes go."""
    _remove_orphaned_homes()
    account = _server_account()
    home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
    (home / OWNER_FILE).write_text(f"{os.getpid()}\n")
    os.chown(home, account.pw_uid, account.pw_gid)
    (base_dir / "pgdata").symlink_to(home / "pgdata")
    (base_dir / "postgres.log").symlink_to(home / "postgres.log")
    return home


def _remove_orphaned_homes() -> None:
    """Server directories whose test process is gone (killed before it could close its server)."""
    for home in Path(tempfile.gettempdir()).glob(HOME_PREFIX + "*"):
        try:
            owner = int((home / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
            continue  # its test process still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if not (home / "pgdata" / "postmaster.pid").exists():  # a server that outlived it keeps its files
            shutil.rmtree(home, ignore_errors=True)


def start_pg_server(base_dir: Path, *, crash_safe: bool = False, host: str = HOST,
                    netns: str | None = None) -> PgServer:
    """initdb into ``base_dir/pgdata`` (which must not exist yet; as root, a link to the server's
    own directory) and start a server on a free 127.0.0.1 port (a new port on a clash).
    ``base_dir/postgres.log`` is the server's log. A test's server runs with
    :data:`TEST_DURABILITY`; ``crash_safe`` (a benchmark's) syncs its new cluster and runs with
    :data:`CRASH_SAFE_DURABILITY`. With ``netns`` it runs in that network namespace and listens on
    ``host`` there (a host of tests/netns_hosts.py).
    Raises ``PgServerMissing`` when the binaries are not installed."""
    bin_dir = find_pg_bin_dir()
    base_dir = base_dir.resolve()
    base_dir.mkdir(parents=True, exist_ok=True)
    if (base_dir / "pgdata").exists() or (base_dir / "pgdata").is_symlink():
        raise FileExistsError(f"{base_dir / 'pgdata'} exists: one server per base_dir")
    home = _own_home(base_dir) if _running_as_root() else None
    data_dir = (home or base_dir) / "pgdata"
    log_file = (home or base_dir) / "postgres.log"
    initdb = [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", USER, "-A", "trust",
              *(() if crash_safe else ("--no-sync",)), "--encoding=UTF8", "--locale=C", "--no-instructions"]
    for attempt in range(_ACCESS_ATTEMPTS):
        shutil.rmtree(data_dir, ignore_errors=True)  # what a failed attempt left
        data_dir.mkdir(mode=0o700)  # initdb wants it private
        if _running_as_root():
            account = _server_account()
            os.chown(data_dir, account.pw_uid, account.pw_gid)
        _let_server_user_reach(data_dir.parent)
        result = subprocess.run(
            _as_server_user(initdb), capture_output=True, text=True, cwd="/", env=_server_env(), check=False
        )
        output = result.stdout + result.stderr
        if result.returncode == 0:
            break
        if _NO_ACCESS not in output or attempt == _ACCESS_ATTEMPTS - 1:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{output}")
    if host != HOST:  # initdb trusts the loopback only: trust the hosts of the server's own subnet
        with open(data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write("host all all samenet trust\n")
    server = PgServer(bin_dir=bin_dir, data_dir=data_dir, port=_free_port(), log_file=log_file, home=home,
                      durability=CRASH_SAFE_DURABILITY if crash_safe else TEST_DURABILITY, host=host, netns=netns)
    if home is not None:
        server.links = [base_dir / "pgdata", base_dir / "postgres.log"]
    for attempt in range(_PORT_ATTEMPTS):
        try:
            server.start()
            return server
        except _StartFailed as exc:
            if not exc.port_clash or attempt == _PORT_ATTEMPTS - 1:
                raise RuntimeError(str(exc)) from None
            server.port = _free_port()
    raise AssertionError("unreachable")
