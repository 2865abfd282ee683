"""Launching a disaggregated prefill/decode group: every prefill and decode engine (each an
:class:`EngineProcess`, in a process group of its own) and the router that joins them, on the
configured host, one API key for the router, one stop for all three kinds."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field

from engine_adapters.base import EngineAdapter
from engine_adapters.config import EngineConfig, Features, PdRole
from engine_adapters.disaggregation import POOL_ROLES, DisaggregatedEngine, has_router, pool_features
from engine_adapters.errors import EXIT_ENGINE_FAILED, TunebenchError
from engine_adapters.launcher import EngineProcess, EngineStartError, free_port
from engine_adapters.process_group import STOP_GRACE_S, process_start_s, stop_group, stop_signals_unblocked
from engine_adapters.secrets import mask_text, remember_secret

ROUTER_READY_TIMEOUT_S = 60.0



class DisaggregatedStartError(TunebenchError):
    exit_code = EXIT_ENGINE_FAILED


@dataclass
class PoolMember:
    role: PdRole
    index: int
    side_port: int
    process: EngineProcess


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
    api_key: str | None = None

    @property
    def pd(self) -> DisaggregatedEngine:
        return self.adapter  # type: ignore[return-value]  # checked by has_router

    @property
    def base_url(self) -> str:
        return f"http://{self.engine.host}:{self.router_port}"

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def pool(self, role: PdRole) -> list[EngineProcess]:
        return [m.process for m in self.members if m.role == role]

    def start(self) -> None:
        """Start every pool engine at once (neither pool needs the other to start)."""
        if not has_router(self.adapter):
            raise DisaggregatedStartError(f"{self.adapter.display_name} has no disaggregated launch in tunebench")
        self.api_key = secrets.token_hex(24) if self.engine.require_api_key else None
        for role in POOL_ROLES:
            features = pool_features(self.features, role)
            for index in range(self.features.pool_instances(role)):
                side_port = free_port(self.engine.host)
                env = {**self.engine.runtime.env, **self.pd.pool_env(features, side_port)}
                engine = self.engine.model_copy(update={
                    "port": 0, "runtime": self.engine.runtime.model_copy(update={"env": env})})
                own = features.model_copy(update={"extra_args": [*features.extra_args,
                                                                 *self.pd.pool_args(features, side_port)]})
                process = EngineProcess(engine, own, self.adapter)
                process.api_key = self.api_key  # one key: the router presents it to every engine
                self.members.append(PoolMember(role, index, side_port, process))
                process.start()

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Wait for every engine, then start the router and wait for it; seconds to ready."""
        started = time.monotonic()
        for member in self.members:
            member.process.wait_ready(timeout_s)
        self._start_router()
        deadline = time.monotonic() + ROUTER_READY_TIMEOUT_S
        while not self.adapter.is_ready(self.base_url):
            if self.router is not None and self.router.poll() is not None:
                raise EngineStartError("the P/D router exited: " + " | ".join(self.router_log[-5:]))
            if time.monotonic() > deadline:
                raise EngineStartError(f"the P/D router was not ready after {ROUTER_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.25)
        return time.monotonic() - started

    def _start_router(self) -> None:
        self.router_port = self.engine.port or free_port(self.engine.host)
        prefill = [(m.process.base_url, m.side_port) for m in self.members if m.role == "prefill"]
        self.router_metrics_port = free_port(self.engine.host)
        argv = self.pd.router_argv(self.engine, self.features, prefill, [p.base_url for p in self.pool("decode")],
                                   self.router_port, metrics_port=self.router_metrics_port)
        env = {**os.environ, **self.engine.runtime.env, "PYTHONUNBUFFERED": "1"}
        if self.api_key:  # through the environment, never argv
            remember_secret(self.api_key)
            env[self.pd.router_api_key_env] = self.api_key
        with stop_signals_unblocked():
            self.router = subprocess.Popen(  # noqa: S603 - argv list, no shell
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                text=True, encoding="utf-8", errors="replace", bufsize=1, start_new_session=True)
        self._router_start_s = process_start_s(self.router.pid)
        threading.Thread(target=self._read_router, daemon=True, name="pd-router-log").start()

    def _read_router(self) -> None:
        assert self.router is not None and self.router.stdout is not None
        for line in self.router.stdout:
            self.router_log.append(mask_text(line.rstrip("\n")))

    def stop(self, grace_s: tuple[float, float, float] = STOP_GRACE_S) -> list[str]:
        """Stop the router, then every engine; what happened to each, in order."""
        done: list[str] = []
        if self.router is not None:
            done.append("router: " + stop_group(self.router.pid, grace_s, leader=self.router,
                                                not_before=getattr(self, "_router_start_s", None)))
        for member in self.members:
            done.append(f"{member.role} {member.index}: {member.process.stop(grace_s)}")
        return done

    def __enter__(self) -> DisaggregatedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
