"""Launching a disaggregated prefill/decode group: every prefill and decode engine (each an
:class:`EngineProcess`, in a process group of its own) and the router that joins them, on the
configured host, one API key for the router, one stop for all three kinds."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_adapters.base import EngineAdapter, FeatureCheck
from engine_adapters.bounded_http import FetchError, fetch
from engine_adapters.config import EngineConfig, Features, PdRole, SpeculativeConfig
from engine_adapters.disaggregation import POOL_ROLES, DisaggregatedEngine, has_router, pool_features
from engine_adapters.errors import EXIT_ENGINE_FAILED, TunebenchError
from engine_adapters.launcher import (
    EngineProcess,
    EngineStartError,
    ExitCallback,
    LogCallback,
    PhaseCallback,
    free_port,
    metrics_after_probe,
    send_probes,
)
from engine_adapters.process_group import STOP_GRACE_S, process_start_s, stop_group, stop_signals_unblocked
from engine_adapters.prometheus import METRICS_MAX_BYTES, labelled_samples
from engine_adapters.secrets import mask_text, remember_secret
from engine_adapters.watchdog import Watchdog

ROUTER_READY_TIMEOUT_S = 60.0
SCRAPE_DEADLINE_S = 10.0
WARM_UP_ATTEMPTS = 5
"""The decode engine handshakes with a prefill engine on its first request, under a fixed timeout
(vLLM's NIXL side channel: 5 s), which a loaded machine can miss once (docs/engines.md).
vllm-router is told to retry nothing itself (a measurement counts every failure), so its tries
are all here."""
WARM_UP_TIMEOUT_S = 300.0
ROUTER_LOG_END_S = 5.0
"""How long a stop waits for the stopped router's last lines."""

class DisaggregatedStartError(TunebenchError):
    exit_code = EXIT_ENGINE_FAILED


class PoolEngine(Protocol):
    """What the group needs of one pool engine: an :class:`EngineProcess` here, or a stand-in for
    one on another node of a cluster (``app.fleet``)."""

    argv: list[str]
    diagnosis: Any

    @property
    def base_url(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    def is_running(self) -> bool: ...

    def wait_ready(self, timeout_s: float | None = None, cancel: threading.Event | None = None) -> object: ...

    def stop(self, grace_s: tuple[float, float, float] = STOP_GRACE_S) -> str: ...


@dataclass(frozen=True)
class PoolSeat:
    """One engine of a pool, as the group asks for it: its configuration (the group's host until a
    launcher places it elsewhere) and the key the router presents."""

    role: PdRole
    index: int
    engine: EngineConfig
    features: Features
    """The pool's features (``pool_features``)."""
    api_key: str | None

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"


@dataclass
class PoolMember:
    """One pool engine of the group, as its launcher started it."""

    role: PdRole
    index: int
    side_port: int
    """Its connector's side channel or bootstrap port."""
    process: PoolEngine
    node_id: str | None = None
    """The cluster node it runs on, when a launcher placed it on one."""


PoolLauncher = Callable[[PoolSeat, EngineAdapter, LogCallback | None, PhaseCallback | None, ExitCallback | None],
                        PoolMember]
"""Starts one pool engine somewhere; the first decode engine must start here, beside the router
and the load client."""


def launch_here(seat: PoolSeat, adapter: EngineAdapter, on_log: LogCallback | None, on_phase: PhaseCallback | None,
                on_exit: ExitCallback | None, node_id: str | None = None) -> PoolMember:
    """A pool engine on this machine, listening on its seat's host, with its connector's
    environment and arguments (a side port of its own)."""
    pd: DisaggregatedEngine = adapter  # type: ignore[assignment]  # checked by has_router
    host = seat.engine.host
    side_port = free_port(host)
    try:
        env = {**seat.engine.runtime.env, **pd.pool_env(seat.features, side_port, host)}
    except ValueError as exc:  # an address no interface of this machine holds
        raise DisaggregatedStartError(f"{seat.name}: {exc}") from None
    engine = seat.engine.model_copy(update={"port": 0, "runtime": seat.engine.runtime.model_copy(update={"env": env})})
    own = seat.features.model_copy(update={"extra_args": [*seat.features.extra_args,
                                                          *pd.pool_args(seat.features, side_port)]})
    process = EngineProcess(engine, own, adapter, on_log=_prefixed_log(on_log, seat.name),
                            on_phase=_prefixed_phase(on_phase, seat.name), on_exit=on_exit)
    process.api_key = seat.api_key  # one key: the router presents it to every engine
    process.start()
    return PoolMember(seat.role, seat.index, side_port, process, node_id)


@dataclass
class DisaggregatedGroup:
    """Both pools and the router: started from argv lists in process groups of their own on the
    configured host, one API key for all, stopped together (router first, then every engine)."""

    engine: EngineConfig
    features: Features
    adapter: EngineAdapter
    members: list[PoolMember] = field(default_factory=list)
    router: subprocess.Popen[str] | None = None
    router_port: int = 0
    router_metrics_port: int = 0
    router_log: list[str] = field(default_factory=list)
    router_argv: list[str] = field(default_factory=list)
    api_key: str | None = None
    on_log: LogCallback | None = None
    on_phase: PhaseCallback | None = None
    on_exit: ExitCallback | None = None
    """Each engine's, its lines and phases prefixed with its pool and index."""
    launch_member: PoolLauncher = launch_here
    """Where each pool engine starts: here, or (pools spread over a cluster) on a node of its own."""

    @property
    def pd(self) -> DisaggregatedEngine:
        return self.adapter  # type: ignore[return-value]  # checked by has_router

    @property
    def base_url(self) -> str:
        return f"http://{self.engine.host}:{self.router_port}"

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def pool(self, role: PdRole) -> list[PoolEngine]:
        return [m.process for m in self.members if m.role == role]

    @property
    def first_decode(self) -> EngineProcess:
        """The decode engine beside the router and the client: its settings, KV capacity and
        client cores stand for the pool's."""
        first = self.pool("decode")[0]
        assert isinstance(first, EngineProcess), "the first decode engine runs here"
        return first

    def start(self) -> None:
        """Start every pool engine at once (neither pool needs the other to start)."""
        if not has_router(self.adapter):
            raise DisaggregatedStartError(f"{self.adapter.display_name} has no disaggregated launch in tunebench")
        self.api_key = secrets.token_hex(24) if self.engine.require_api_key else None
        self.router_port = self.engine.port or free_port(self.engine.host)  # known before the router starts
        for role in ("decode", "prefill"):  # the first decode engine first: it starts here
            features = pool_features(self.features, role)
            for index in range(self.features.pool_instances(role)):
                seat = PoolSeat(role, index, self.engine, features, self.api_key)
                self.members.append(self.launch_member(seat, self.adapter, self.on_log, self.on_phase, self.on_exit))
        self.members.sort(key=lambda m: (POOL_ROLES.index(m.role), m.index))

    def wait_ready(self, timeout_s: float | None = None, cancel: threading.Event | None = None) -> float:
        """Wait for every engine, then start the router and wait for it; seconds to ready."""
        started = time.monotonic()
        for member in self.members:
            try:
                member.process.wait_ready(timeout_s, cancel=cancel)
            except EngineStartError as exc:
                raise EngineStartError(f"{member.role} engine {member.index}: {exc}", exc.diagnosis,
                                       exc.engine_exit_code) from None
        self._start_router()
        deadline = time.monotonic() + ROUTER_READY_TIMEOUT_S
        while not self.adapter.is_ready(self.base_url):
            if self.router is not None and self.router.poll() is not None:
                raise EngineStartError("the P/D router exited: " + " | ".join(self.router_log[-5:]))
            if cancel is not None and cancel.is_set():
                raise EngineStartError("startup cancelled")
            if time.monotonic() > deadline:
                raise EngineStartError(f"the P/D router was not ready after {ROUTER_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.25)
        return time.monotonic() - started

    def is_running(self) -> bool:
        """Whether every engine and the router live."""
        return (all(m.process.is_running() for m in self.members)
                and (self.router is None or self.router.poll() is None))

    def gone(self) -> str | None:
        """What exited, in one line (None: all live)."""
        for m in self.members:
            if not m.process.is_running():
                return f"{m.role} engine {m.index} exited: {m.process.diagnosis or 'unknown cause'}"
        if self.router is not None and self.router.poll() is not None:
            return "the P/D router exited: " + " | ".join(self.router_log[-3:])
        return None

    def warm_up(self, model: str, prompt: str, max_tokens: int = 4, *, cancel: threading.Event | None = None,
                attempts: int = WARM_UP_ATTEMPTS) -> list[str]:
        """One completion through the router before any timed load, so the decode engines'
        handshake with the prefill engines is done; retried on failure. What each failed try said
        (empty: the first worked). Raises EngineStartError when none worked."""
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
        failed: list[str] = []
        for _ in range(attempts):
            if cancel is not None and cancel.is_set():
                raise EngineStartError("warm-up cancelled")
            try:
                reply = fetch(self.base_url + "/v1/completions", deadline_s=WARM_UP_TIMEOUT_S, max_bytes=2**20,
                              method="POST", body=body,
                              headers={"Content-Type": "application/json", **self.auth_headers()})
                if reply.ok:
                    return failed
                failed.append(f"HTTP {reply.status}: {mask_text(' '.join(reply.text.split())[:300])}")  # one line
            except (FetchError, OSError) as exc:
                failed.append(mask_text(str(exc)))
            gone = self.gone()
            if gone is not None:
                raise EngineStartError(f"{gone} (warm-up: {failed[-1]})")
        raise EngineStartError(f"the P/D warm-up request failed {attempts} times through the router; last: "
                               f"{failed[-1]}")

    def verify_features(self, model: str) -> list[FeatureCheck]:
        """The first decode engine's settings check (its echo of its flags), with prefix caching
        judged where prompts are computed: two identical prompts of ``model`` (its served name)
        through the router, the prefill engine's counters read around them. With several prefill
        engines the router may send the two to different ones, so there the decode engine's own
        check stands."""
        checks = self.first_decode.verify_features(probe=False)
        prefill = self.pool("prefill")
        if self.features.prefix_caching is None or len(prefill) != 1:
            return checks
        features = pool_features(self.features, "prefill").model_copy(update={"speculative": SpeculativeConfig()})
        bodies = self.adapter.probe_requests(features)
        url = prefill[0].base_url + self.adapter.metrics_path

        def read() -> str:
            try:
                reply = fetch(url, deadline_s=SCRAPE_DEADLINE_S, max_bytes=METRICS_MAX_BYTES, headers=self.auth_headers())
            except (FetchError, OSError):
                return ""
            return reply.text if reply.ok else ""

        before = read()
        # Through the router, as the warm-up went: prefill, KV transfer and decode, which under
        # load took longer than one engine's probe bound (the check then read "unknown").
        error = send_probes(self.base_url, self.auth_headers(), bodies, model, timeout_s=WARM_UP_TIMEOUT_S)
        finished = self.adapter.metric_names.counters.get("requests_finished", ())
        after = metrics_after_probe(read, finished, before, len(bodies))
        probed = self.adapter.verify(features, [], after, before_text=before or None, probe_error=error)
        where_computed = {c.key: c for c in probed if c.key == "prefix_caching"}
        return [where_computed.get(c.key, c) for c in checks]

    def pool_figures(self) -> list[dict[str, Any]]:
        """Each engine's and the router's counters of :attr:`DisaggregatedEngine.pool_metrics`, now
        (a label set after the name, as Prometheus writes it); an unreadable page: ``error``."""
        wanted = set(self.pd.pool_metrics)
        out = [{"role": m.role, "index": m.index, "url": m.process.base_url,
                **_scrape(m.process.base_url + self.adapter.metrics_path, wanted, self.auth_headers())}
               for m in self.members]
        if self.router is not None and self.router_metrics_port:
            url = f"http://{self.engine.host}:{self.router_metrics_port}"
            out.append({"role": "router", "index": 0, "url": url, **_scrape(url + "/metrics", wanted, {})})
        return out

    def _start_router(self) -> None:
        self.router_port = self.router_port or self.engine.port or free_port(self.engine.host)
        prefill = [(m.process.base_url, m.side_port) for m in self.members if m.role == "prefill"]
        self.router_metrics_port = free_port(self.engine.host)
        argv = self.pd.router_argv(self.engine, self.features, prefill, [p.base_url for p in self.pool("decode")],
                                   self.router_port, metrics_port=self.router_metrics_port)
        self.router_argv = argv
        env = {**os.environ, **self.engine.runtime.env, "PYTHONUNBUFFERED": "1"}
        if self.api_key:  # through the environment, never argv
            remember_secret(self.api_key)
            env[self.pd.router_api_key_env] = self.api_key
        with stop_signals_unblocked():
            self.router = subprocess.Popen(  # noqa: S603 - argv list, no shell
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                text=True, encoding="utf-8", errors="replace", bufsize=1, start_new_session=True)
        self._router_start_s = process_start_s(self.router.pid)
        try:  # if tunebench dies, the router goes too (the engines have watchdogs of their own)
            self._router_watchdog: Watchdog | None = Watchdog(self.router.pid, self._router_start_s or 0.0)
        except OSError:
            self._router_watchdog = None
        self._router_reader = threading.Thread(target=self._read_router, daemon=True, name="pd-router-log")
        self._router_reader.start()

    def _read_router(self) -> None:
        """The router's lines, kept for the group's errors and passed on as the engines' are (a
        run stores them with its log)."""
        assert self.router is not None and self.router.stdout is not None
        for raw in self.router.stdout:
            line = mask_text(raw.rstrip("\n"))
            self.router_log.append(line)
            if self.on_log is not None:
                self.on_log(f"[router] {line}")

    def stop(self, grace_s: tuple[float, float, float] = STOP_GRACE_S) -> list[str]:
        """Stop the router, then every engine; what happened to each, in order."""
        done: list[str] = []
        if self.router is not None:
            done.append("router: " + stop_group(self.router.pid, grace_s, leader=self.router,
                                                not_before=getattr(self, "_router_start_s", None)))
            watchdog = getattr(self, "_router_watchdog", None)
            if watchdog is not None:
                watchdog.release()
            reader = getattr(self, "_router_reader", None)
            if reader is not None:  # its last lines belong to this run's log, not the next one's
                reader.join(ROUTER_LOG_END_S)
        for member in self.members:
            done.append(f"{member.role} {member.index}: {member.process.stop(grace_s)}")
        return done

    @property
    def pids(self) -> list[int]:
        """Every engine's and the router's leader."""
        return [p for p in [*(m.process.pid for m in self.members), self.router.pid if self.router else None]
                if p is not None]

    def __enter__(self) -> DisaggregatedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pool_deltas(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine (and the router), what its counters gained between two :meth:`pool_figures`."""
    old = {(b["role"], b["index"]): b for b in before}
    out = []
    for a in after:
        b = old.get((a["role"], a["index"]), {})
        entry = {k: a[k] for k in ("role", "index", "url")}
        if "counters" in a and "counters" in b:
            entry["counters"] = {name: value - b["counters"].get(name, 0.0) for name, value in a["counters"].items()}
        else:
            entry["error"] = a.get("error") or b.get("error") or "no reading before the level"
        out.append(entry)
    return out


def _scrape(url: str, wanted: set[str], headers: dict[str, str]) -> dict[str, Any]:
    try:
        reply = fetch(url, deadline_s=SCRAPE_DEADLINE_S, max_bytes=METRICS_MAX_BYTES, headers=headers)
        if not reply.ok:
            return {"error": f"HTTP {reply.status}"}
        samples = labelled_samples(reply.text, wanted)
    except (FetchError, OSError, ValueError) as exc:
        return {"error": mask_text(str(exc))}
    counters: dict[str, float] = {}
    for name, labels, value in samples:
        shown = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
        key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(shown.items())) + "}" if shown else "")
        counters[key] = counters.get(key, 0.0) + value
    return {"counters": counters}


def _prefixed_log(on_log: LogCallback | None, name: str) -> LogCallback | None:
    return None if on_log is None else (lambda line: on_log(f"[{name}] {line}"))


def _prefixed_phase(on_phase: PhaseCallback | None, name: str) -> PhaseCallback | None:
    return None if on_phase is None else (lambda phase, detail: on_phase(phase, f"{name}: {detail}"))
