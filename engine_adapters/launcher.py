"""Launching and stopping a real engine process, safely.

- The engine starts from an argv list (never a shell) in a new session, hence its own process
  group, bound to 127.0.0.1 with a per-run API key passed through the environment.
- Its output is streamed line by line; startup phases are parsed from it; readiness is /health.
- If it exits during startup, the log is diagnosed at once (no waiting for a time-out).
- Stopping signals the whole group: SIGINT, then SIGTERM, then SIGKILL.
- A watchdog process per engine stops it the moment the tunebench process that started it dies,
  however it dies (see ``watchdog.py``).
- Every engine is also written to a per-user registry with its owner's PID, so an engine orphaned
  along with its watchdog is found and stopped the next time tunebench starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapters.base import Diagnosis, EngineAdapter, FeatureCheck, Phase, match_phase
from engine_adapters.config import EngineConfig, Features
from engine_adapters.cpu_binding import launch_env
from engine_adapters.errors import EXIT_ENGINE_FAILED, TunebenchError
from engine_adapters.paths import state_dir
from engine_adapters.process_group import (
    STOP_GRACE_S,
    group_members,
    process_identity,
    process_start_s,
    same_process_alive,
    stop_group,
    stop_signals_unblocked,
)
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model
from engine_adapters.secrets import is_secret_name, mask_text, remember_secret
from engine_adapters.watchdog import WATCHDOG_GRACE_S, Watchdog

__all__ = ["STOP_GRACE_S", "EngineProcess", "EngineStartError", "group_members", "reap_orphans", "stop_group"]

LogCallback = Callable[[str], None]
PhaseCallback = Callable[[Phase, str], None]
ExitCallback = Callable[[int, "Diagnosis | None"], None]

MAX_LOG_LINES = 200_000
PROBE_TIMEOUT_S = 60.0  # one feature-probe request (a few tokens; a busy engine may queue it)
PROBE_SETTLE_S = 5.0  # how long to wait for the engine to count the probe requests


def send_probes(base_url: str, headers: dict[str, str], bodies: list[dict[str, Any]],
                model: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Send the probe requests to ``base_url`` (an engine, or a P/D group's router) one after
    another (the second prefix probe must find the first cached); None when all succeeded, else
    what went wrong, in one line. ``model``: the served name (None: the engine's first listed);
    ``timeout_s``: each request's bound."""
    headers = {"Content-Type": "application/json", **headers}
    try:
        if model is None:
            listing = urllib.request.Request(base_url + "/v1/models", headers=headers)
            with urllib.request.urlopen(listing, timeout=timeout_s) as resp:  # noqa: S310 - a URL we built
                model = json.loads(resp.read())["data"][0]["id"]
        for body in bodies:
            request = urllib.request.Request(base_url + "/v1/completions", headers=headers,
                                             data=json.dumps({"model": model, **body}).encode())
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - a URL we built
                resp.read()
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read().decode("utf-8", "replace").split())[:200]
        return mask_text(f"HTTP {exc.code}: {detail}")
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return mask_text(f"{type(exc).__name__}: {exc}")
    return None


def metrics_after_probe(read: Callable[[], str], finished_names: tuple[str, ...], before: str,
                        n_requests: int) -> str:
    """/metrics (``read``) once the engine counted the probe's requests (it may record a step
    just after answering them): read until its finished-requests counter moved by ``n_requests``."""
    start = _counter_total(before, finished_names)
    deadline = time.monotonic() + PROBE_SETTLE_S
    while True:
        after = read()
        done = _counter_total(after, finished_names)
        if start is None or done is None or done - start >= n_requests or time.monotonic() >= deadline:
            return after
        time.sleep(0.1)


def _counter_total(text: str, names: tuple[str, ...]) -> float | None:
    """Sum over label sets of the first of ``names`` present in Prometheus text."""
    for name in names:
        values = [line.rsplit(" ", 1)[-1] for line in text.splitlines()
                  if line.startswith((name + "{", name + " "))]
        try:
            if values:
                return sum(float(v) for v in values)
        except ValueError:
            return None
    return None


class EngineStartError(TunebenchError):
    """The engine did not become ready; ``diagnosis`` holds plain advice when recognised and
    ``engine_exit_code`` the engine's own exit status when it died (``exit_code`` is the CLI's, 3)."""

    exit_code = EXIT_ENGINE_FAILED

    def __init__(self, message: str, diagnosis: Diagnosis | None = None, engine_exit_code: int | None = None):
        super().__init__(message)
        self.diagnosis = diagnosis
        self.engine_exit_code = engine_exit_code


LISTEN_PORTS = (20_000, 32_767)
"""Where ports for an engine to listen on are picked: below Linux's usual range of ephemeral
ports (``net.ipv4.ip_local_port_range``, 32768-60999), which the kernel hands to every outgoing
connection, and above Ray's default range of worker ports (10002-19999). A port picked there stays free only until some connection takes it as its source
port; an engine binds its ports up to minutes after the pick (vLLM's NIXL side channel once found
its port taken so, under load, and its handshake listener died)."""
PORT_PICKS = 50


def free_port(host: str = "127.0.0.1") -> int:
    """A port that ``host`` can bind now, outside the ephemeral range when the kernel's range
    leaves room below it (else what the kernel hands out)."""
    low, high = LISTEN_PORTS
    ephemeral_low = _ephemeral_low()
    if ephemeral_low is not None:
        high = min(high, ephemeral_low - 1)
    rng = secrets.SystemRandom()
    for _ in range(PORT_PICKS if high - low > 1_000 else 0):
        port = rng.randint(low, high)
        if port_is_free(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int | None:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _signal_diagnosis(exit_code: int) -> Diagnosis | None:
    """A leader killed by a signal leaves no error in its log: say who may have done it."""
    if exit_code >= 0:
        return None
    name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else f"signal {-exit_code}"
    return Diagnosis("killed", f"The engine was killed by {name} from outside (another process, or the kernel's "
                               "out-of-memory killer: check `dmesg`).")


# --- the registry of running engines ----------------------------------------------------------

@dataclass
class EngineRecord:
    """One registry entry. The ``*create_time`` fields hold starts as ``process_start_s`` gives them
    (their names are the file format's)."""

    pid: int
    pgid: int
    create_time: float
    owner_pid: int
    owner_create_time: float
    port: int
    argv: list[str]
    started_at: float
    watchdog_pid: int | None = None

    @property
    def path(self) -> Path:
        return registry_dir() / f"{self.pid}.json"


def registry_dir() -> Path:
    path = state_dir() / "engines"
    path.mkdir(parents=True, exist_ok=True)
    return path


def register(record: EngineRecord) -> None:
    tmp = record.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.__dict__))
    tmp.replace(record.path)


def registered_engines() -> list[EngineRecord]:
    records = []
    for path in registry_dir().glob("*.json"):
        try:
            records.append(EngineRecord(**json.loads(path.read_text())))
        except (ValueError, TypeError, OSError):
            path.unlink(missing_ok=True)  # a torn or foreign file: nothing we can act on
    return records


def reap_orphans(log: LogCallback | None = None,
                 grace_s: tuple[float, float, float] = STOP_GRACE_S) -> list[EngineRecord]:
    """Stop engines whose owning tunebench process is gone; return what was stopped."""
    stopped = []
    for record in registered_engines():
        if same_process_alive(record.owner_pid, record.owner_create_time):
            continue
        if group_members(record.pgid, not_before=record.create_time):
            how = stop_group(record.pgid, grace_s, not_before=record.create_time)
            stopped.append(record)
            if log:
                log(f"stopped orphaned engine pid {record.pid} (port {record.port}) left by a tunebench "
                    f"process that died: {how}")
        record.path.unlink(missing_ok=True)
    return stopped


def stop_registered(log: LogCallback | None = None) -> list[EngineRecord]:
    """Stop every engine this user's tunebench processes started (``tunebench engine stop``)."""
    stopped = []
    for record in registered_engines():
        if group_members(record.pgid, not_before=record.create_time):
            how = stop_group(record.pgid, not_before=record.create_time)
            stopped.append(record)
            if log:
                log(f"stopped engine pid {record.pid} on port {record.port}: {how}")
        record.path.unlink(missing_ok=True)
    return stopped


# --- one engine -------------------------------------------------------------------------------

@dataclass
class ReadyInfo:
    base_url: str
    startup_s: float
    kv_cache: dict[str, float] = field(default_factory=dict)


QUIET_AT_EXIT = "ignore::UserWarning:multiprocessing.resource_tracker"
"""A Python engine's multiprocessing tracker warns, at every stop, of semaphores and shared memory
its workers did not unregister (it removes them itself): a warning filter for the engine's own
processes, never for tunebench's, keeps that out of the log shown to the user."""


class EngineProcess:
    """A launched engine: its process group, log, phases, readiness and stop."""

    watchdog_grace_s: tuple[float, float, float] = WATCHDOG_GRACE_S

    def __init__(
        self,
        engine: EngineConfig,
        features: Features,
        adapter: EngineAdapter | None = None,
        *,
        on_log: LogCallback | None = None,
        on_phase: PhaseCallback | None = None,
        on_exit: ExitCallback | None = None,
    ) -> None:
        self.engine = engine
        self.features = features
        self.adapter: EngineAdapter = adapter or get_adapter(engine.kind)
        self.on_log, self.on_phase, self.on_exit = on_log, on_phase, on_exit
        # hex: a key never starts with "-", which a command line (`--api-key KEY`) takes for an option
        self.api_key: str | None = secrets.token_hex(24) if engine.require_api_key else None
        self.port = engine.port
        self.argv: list[str] = []
        self.env_added: dict[str, str] = {}
        self.log_lines: list[str] = []
        self.phase = Phase.LAUNCHING
        self.proc: subprocess.Popen[str] | None = None
        self.started_monotonic = 0.0
        self.ready_info: ReadyInfo | None = None
        self.exit_code: int | None = None
        self.exited_monotonic: float | None = None
        self.diagnosis: Diagnosis | None = None
        self._stopping = False
        self._reader: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._record: EngineRecord | None = None
        self._watchdog: Watchdog | None = None

    # -- properties -----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.engine.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        """Whether the leader lives. Not ``proc.poll()``: while the watcher thread waits on the
        process, ``poll()`` from another thread always answers None."""
        return self.proc is not None and self.exited_monotonic is None and self.proc.returncode is None

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # -- start ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the process (returns at once; use :meth:`wait_ready`)."""
        if self.proc is not None:
            raise RuntimeError("engine already started")
        reap_orphans(self.on_log)
        if self.port == 0:
            self.port = free_port(self.engine.host)
        elif not port_is_free(self.engine.host, self.port):
            raise EngineStartError(
                f"port {self.port} on {self.engine.host} is already in use by another process: choose another port, "
                "or 0 for a free one", Diagnosis("port_in_use", f"port {self.port} is already in use"))
        self.argv = self.adapter.build_argv(self.engine, self.features, self.port)
        self.env_added = self.adapter.build_env(self.engine, self.api_key)
        self.env_added.update(launch_env(self.engine, self.env_added))  # engine threads off the client's core
        for name, value in self.env_added.items():  # the log must never show them, in any form
            if is_secret_name(name):
                remember_secret(value)
        env = {**os.environ, **self.env_added, "PYTHONUNBUFFERED": "1",
               "PYTHONWARNINGS": ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), QUIET_AT_EXIT)))}
        self.started_monotonic = time.monotonic()
        self._set_phase(Phase.LAUNCHING, " ".join(self.argv[:3]))
        try:
            with stop_signals_unblocked():
                self.proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
                    self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    env=env, text=True, encoding="utf-8", errors="replace", bufsize=1, start_new_session=True,
                )
        except OSError as exc:
            raise EngineStartError(f"could not start the engine ({self.argv[0]}): {exc.strerror}") from exc
        owner_pid, owner_start_s = process_identity()
        engine_start_s = process_start_s(self.proc.pid)
        self._record = EngineRecord(
            pid=self.proc.pid, pgid=self.proc.pid,
            create_time=engine_start_s if engine_start_s is not None else owner_start_s,
            owner_pid=owner_pid, owner_create_time=owner_start_s, port=self.port, argv=self.argv,
            started_at=time.time())
        try:
            self._watchdog = Watchdog(self.proc.pid, self._record.create_time, self._record.path,
                                      self.watchdog_grace_s)
            self._record.watchdog_pid = self._watchdog.pid
        except OSError as exc:  # the registry still catches an orphan at the next start
            if self.on_log:
                self.on_log(f"tunebench: could not start the engine's watchdog ({exc.strerror}); if tunebench "
                            "dies, the engine is stopped only when tunebench next starts")
        register(self._record)
        self._reader = threading.Thread(target=self._read_output, name=f"engine-log-{self.proc.pid}", daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch_exit, name=f"engine-exit-{self.proc.pid}", daemon=True)
        self._watcher.start()

    def _set_phase(self, phase: Phase, detail: str) -> None:
        """Engines log phases in different orders; only the end states are sticky."""
        terminal = (Phase.READY, Phase.FAILED, Phase.STOPPING, Phase.STOPPED)
        if self.phase in terminal and phase not in terminal:
            return
        if phase == self.phase and phase != Phase.LAUNCHING:
            return  # the next log line of the same phase (e.g. a progress bar): the log has it
        self.phase = phase
        if self.on_phase:
            self.on_phase(phase, detail)

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            for part in raw.rstrip("\n").split("\r"):
                if not part.strip():
                    continue
                line = mask_text(part)  # the log is shown, stored and diagnosed: never with a secret in it
                with self._lock:
                    if len(self.log_lines) < MAX_LOG_LINES:
                        self.log_lines.append(line)
                if self.on_log:
                    self.on_log(line)
                phase = match_phase(self.adapter.phase_patterns, line)
                if phase is not None and phase != Phase.READY:
                    self._set_phase(phase, line.strip())

    def _watch_exit(self) -> None:
        """Wait for the leader to exit; if nobody asked it to, end the group and explain why."""
        assert self.proc is not None
        code = self.proc.wait()
        self.exited_monotonic = time.monotonic()
        self.exit_code = code
        if not self._stopping:
            # Children (engine core, workers) may outlive the leader and hold the log pipe open.
            stop_group(self.proc.pid, grace_s=(0.5, 2.0, 2.0), leader=self.proc)
            if self._reader is not None:
                self._reader.join(timeout=10)
            if code in (0, -signal.SIGINT, -signal.SIGTERM) and self.phase == Phase.READY:
                # Stopped from outside (e.g. `tunebench engine stop`), not a crash.
                self._set_phase(Phase.STOPPED, f"stopped from outside (exit code {code})")
            else:
                self.diagnosis = self.adapter.diagnose(self.snapshot_log()) or _signal_diagnosis(code)
                self._set_phase(Phase.FAILED, str(self.diagnosis or f"engine exited with code {code}"))
            self._unregister()
            self._release_watchdog()
            if self.on_exit:
                self.on_exit(code, self.diagnosis)

    def wait_exited(self, timeout_s: float = 10.0) -> int | None:
        """After the process is gone, wait until its exit was handled (phase, diagnosis)."""
        if self._watcher is not None:
            self._watcher.join(timeout=timeout_s)
        return self.exit_code

    def snapshot_log(self) -> list[str]:
        with self._lock:
            return list(self.log_lines)

    def wait_ready(self, timeout_s: float | None = None, cancel: threading.Event | None = None) -> ReadyInfo:
        """Block until /health answers 200; raise EngineStartError at once if the engine dies."""
        assert self.proc is not None, "start() first"
        timeout_s = timeout_s if timeout_s is not None else self.engine.startup_timeout_s
        deadline = self.started_monotonic + timeout_s
        while True:
            if self.proc.poll() is not None:
                if self._watcher:
                    self._watcher.join(timeout=15)
                diagnosis = self.diagnosis or self.adapter.diagnose(self.snapshot_log())
                message = str(diagnosis) if diagnosis else f"the engine exited during startup (code {self.proc.returncode})"
                raise EngineStartError(message, diagnosis, self.proc.returncode)
            if cancel is not None and cancel.is_set():
                raise EngineStartError("startup cancelled")
            if self.adapter.is_ready(self.base_url):
                startup_s = time.monotonic() - self.started_monotonic
                self.ready_info = ReadyInfo(self.base_url, startup_s, self.adapter.kv_cache(self.snapshot_log()))
                self._set_phase(Phase.READY, f"ready in {startup_s:.1f} s at {self.base_url}")
                return self.ready_info
            if time.monotonic() > deadline:
                self.stop()
                raise EngineStartError(f"the engine was not ready after {timeout_s:.0f} s (last phase: "
                                       f"{self.phase.value}); it was stopped")
            time.sleep(0.25)

    # -- after ready ----------------------------------------------------------------------------

    def fetch_metrics_text(self, timeout_s: float = 5.0) -> str:
        request = urllib.request.Request(self.base_url + self.adapter.metrics_path, headers=self.auth_headers())
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - loopback URL we built
            return str(resp.read().decode("utf-8", "replace"))

    def verify_features(self, probe: bool = True) -> list[FeatureCheck]:
        """Check that requested features took effect: the engine's echo of its arguments, the KV
        capacity it reported, and /metrics around the adapter's probe requests (a few tiny
        completions that exercise prefix caching or speculation: "active" means it worked)."""
        bodies = self.adapter.probe_requests(self.features) if probe else []
        before = self._metrics_or_empty()
        after, error = before, None
        if bodies:
            error = self._send_probes(bodies)
            after = self._metrics_after_probe(before, len(bodies))
        return self.adapter.verify(self.features, self.snapshot_log(), after,
                                   before_text=before if bodies and before else None, probe_error=error,
                                   model_config=self._model_config())

    def _metrics_or_empty(self) -> str:
        try:
            return self.fetch_metrics_text()
        except (urllib.error.URLError, OSError):
            return ""

    def _send_probes(self, bodies: list[dict[str, Any]]) -> str | None:
        return send_probes(self.base_url, self.auth_headers(), bodies)

    def _metrics_after_probe(self, before: str, n_requests: int) -> str:
        return metrics_after_probe(self._metrics_or_empty, self.adapter.metric_names.counters.get("requests_finished", ()),
                                   before, n_requests)

    def _model_config(self) -> dict[str, Any]:
        """The model's config.json when the model is a local folder (KV bytes per token)."""
        try:
            path = Path(resolve_model(self.engine.model)).expanduser() / "config.json"
            data = json.loads(path.read_text(encoding="utf-8"))
        except (RuntimeErrorMessage, OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- stop -----------------------------------------------------------------------------------

    def stop(self, grace_s: tuple[float, float, float] = STOP_GRACE_S) -> str:
        """End the whole process group; safe to call twice and after the engine died."""
        if self.proc is None:
            return "not started"
        self._stopping = True
        self._set_phase(Phase.STOPPING, "stopping")
        how = stop_group(self.proc.pid, grace_s, leader=self.proc,
                         not_before=self._record.create_time if self._record else None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for thread in (self._reader, self._watcher):
            if thread is not None:
                thread.join(timeout=5)
        self._unregister()
        self._release_watchdog()
        self._set_phase(Phase.STOPPED, how)
        return how

    def _unregister(self) -> None:
        if self._record is not None:
            self._record.path.unlink(missing_ok=True)

    def _release_watchdog(self) -> None:
        with self._lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.release()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
