"""Runs the samplers on background threads and publishes everything on the bus, on one clock.

Sources: ``gpu<i>`` (NVML, default every 100 ms), ``host`` (psutil, 500 ms) and ``engine``
(Prometheus /metrics, 1 s). Each sample carries the (monotonic, wall) pair of the moment it was
read. Besides samples the collector publishes:

- :class:`~app.events.TelemetrySupport` once per source (``gpu0``..., ``gpu`` without a usable
  NVIDIA GPU, ``host``, ``engine``), when the source knows what it can measure: supported value
  names, and why each other one is not. Without NVML the GPU report has ``source="gpu"``,
  ``available=False``, ``state="no NVIDIA GPU"``; the engine's report comes after its first
  successful scrape.
- :class:`~app.events.Notice`: once per new condition (engine metrics unreachable / reachable
  again, counters reset by an engine restart, a GPU query that stopped working), never once per
  failed tick.

Samplers never block the caller or the run: ``start`` only starts threads (NVML init happens
on the GPU thread), scrapes have timeouts and a failing scrape is counted in ``stats()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from app.bus import Bus, now
from app.events import Notice, TelemetrySupport
from app.telemetry.engine_metrics import EngineScraper, RateDeriver, ScrapeError, metrics_url_from, support
from app.telemetry.gpu import GpuSampler
from app.telemetry.host import HostSampler, ProcessTree
from app.telemetry.remote_gpu import RemoteGpuError, read_gpus, support_reports
from engine_adapters.base import MetricNames
from engine_adapters.registry import get_engine_metrics
from engine_adapters.secrets import mask_url


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.data: dict[str, dict[str, Any]] = {}

    def bump(self, source: str, key: str, by: int = 1) -> None:
        with self._lock:
            entry = self.data.setdefault(source, {"samples": 0, "errors": 0})
            entry[key] = entry.get(key, 0) + by

    def set(self, source: str, key: str, value: Any) -> None:
        with self._lock:
            self.data.setdefault(source, {"samples": 0, "errors": 0})[key] = value

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self.data.items()}


class _Reachability:
    """Whether a scraped source answers: every failure is counted, but an outage and its end are
    each said once (a :class:`Notice`), never once per failed tick."""

    def __init__(self, stats: _Stats, notice: Callable[[str, str], None], source: str, what: str) -> None:
        self._stats, self._notice, self.source, self.what = stats, notice, source, what
        self.failing = False

    def failed(self, exc: Exception) -> None:
        self._stats.bump(self.source, "errors")
        self._stats.set(self.source, "last_error", str(exc))
        if not self.failing:
            self.failing = True
            self._notice(self.source, f"{self.what} unreachable, retrying: {exc}")

    def answered(self, where: str) -> None:
        if self.failing:
            self.failing = False
            self._notice(self.source, f"{self.what} reachable again at {where}")


class TelemetryCollector:
    """GPU, host and engine samplers feeding one bus. An interval of 0 turns a sampler off;
    ``metrics_url`` None turns the engine scraper off; its names are ``metric_names``, else those
    of ``engine_kind``'s adapter. ``nvml`` is a module-like stand-in for ``pynvml`` (tests,
    benchmarks)."""

    def __init__(self, bus: Bus, *, metrics_url: str | None = None, api_key: str | None = None,
                 metric_names: MetricNames | None = None, engine_kind: str = "vllm", engine_pid: int | None = None,
                 gpu_interval_s: float = 0.1, host_interval_s: float = 0.5, engine_interval_s: float = 1.0,
                 nvml: object | None = None, scrape_timeout_s: float | None = None,
                 gpu_metrics_url: str | None = None, also_metrics_urls: Sequence[str] = ()) -> None:
        self.bus = bus
        self.metrics_url = metrics_url_from(metrics_url) if metrics_url else None
        self.also_metrics_urls = [metrics_url_from(url) for url in also_metrics_urls]
        """Engines whose figures add to the first's in the "engine" series (a P/D group's other decode engines)."""
        self.api_key = api_key
        if metric_names is None and metrics_url:
            metric_names = get_engine_metrics(engine_kind).metric_names
        self.metric_names = metric_names
        self.engine_pid = engine_pid
        self.gpu_interval_s, self.host_interval_s, self.engine_interval_s = gpu_interval_s, host_interval_s, engine_interval_s
        # An engine under load answers /metrics late (its API server is busy streaming); a
        # timed-out scrape loses the interval, so the timeout is generous -- stop() cancels it.
        self.scrape_timeout_s = scrape_timeout_s if scrape_timeout_s is not None else max(3.0, 3 * engine_interval_s)
        self._nvml = nvml
        # GPUs of another machine (a DCGM exporter's URL) replace local NVML: the engine is there.
        self.gpu_metrics_url = gpu_metrics_url
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._support: dict[str, TelemetrySupport] = {}
        self._support_lock = threading.Lock()
        self._stats = _Stats()
        self._tree = ProcessTree(engine_pid) if engine_pid else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine_task: asyncio.Task[None] | None = None

    # -- public -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sampler threads and return at once."""
        if self._threads:
            return
        self._stop.clear()
        plans: list[tuple[str, Callable[[], None]]] = []
        if self.gpu_metrics_url:
            plans.append(("telemetry-gpu-remote", self._run_remote_gpu))
        elif self.gpu_interval_s and self.gpu_interval_s > 0:
            plans.append(("telemetry-gpu", self._run_gpu))
        if self.host_interval_s and self.host_interval_s > 0:
            plans.append(("telemetry-host", self._run_host))
        if self.metrics_url and self.metric_names is not None and self.engine_interval_s > 0:
            plans.append(("telemetry-engine", self._run_engine))
        for name, target in plans:
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop every sampler and join the threads (an in-flight scrape is cancelled)."""
        self._stop.set()
        loop, task = self._loop, self._engine_task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # loop already closed
                pass
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def __enter__(self) -> TelemetryCollector:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def support(self) -> dict[str, TelemetrySupport]:
        """The support reports published so far, by source."""
        with self._support_lock:
            return dict(self._support)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per source: samples published, errors counted (failed scrapes, NVML errors), ..."""
        return self._stats.snapshot()

    def thread_ids(self) -> list[int]:
        """Native ids of the sampler threads (the overhead benchmark measures their CPU time)."""
        return [t.native_id for t in self._threads if t.native_id is not None]

    # -- helpers ------------------------------------------------------------------------------

    def _publish_support(self, report: TelemetrySupport) -> None:
        with self._support_lock:
            self._support[report.source] = report
        self.bus.emit(report)

    def _notice(self, source: str, message: str) -> None:
        self.bus.emit(Notice(source=source, message=message))

    def _ticks(self, interval_s: float) -> Any:
        """Fixed-rate schedule that skips missed ticks instead of bursting; ends on stop."""
        next_t = time.monotonic()
        while not self._stop.is_set():
            yield
            next_t += interval_s
            delay = next_t - time.monotonic()
            if delay <= 0:  # late (busy machine): skip the missed ticks, no burst of samples
                next_t, delay = time.monotonic() + interval_s, interval_s
            if self._stop.wait(delay):
                return

    # -- samplers -----------------------------------------------------------------------------

    def _run_gpu(self) -> None:
        sampler = GpuSampler(self._nvml, engine_pids=self._tree.pids if self._tree else None)
        try:
            for report in sampler.open():
                self._publish_support(report)
            if sampler.no_gpu_reason is not None or not sampler.sources:
                return
            for _ in self._ticks(self.gpu_interval_s):
                readings = sampler.sample()
                t = now()
                for source, values in readings:
                    if values:
                        self.bus.sample(source, values, t)
                        self._stats.bump(source, "samples")
                self._stats.set("gpu", "errors", sampler.errors)
                while sampler.notices:
                    self._notice("gpu", sampler.notices.pop(0))
        except Exception as exc:  # noqa: BLE001 - a sampler bug must not take the run down
            self._stats.bump("gpu", "errors")
            self._notice("gpu", f"GPU sampler stopped: {type(exc).__name__}: {exc}")
        finally:
            sampler.close()

    def _run_remote_gpu(self) -> None:
        """The exporter's GPUs, once a second at most (it refreshes its own fields every few
        seconds; faster reads would only repeat them)."""
        assert self.gpu_metrics_url is not None
        url, reported = self.gpu_metrics_url, False
        reach = _Reachability(self._stats, self._notice, "gpu", "remote GPU metrics")
        try:
            for _ in self._ticks(max(1.0, self.gpu_interval_s)):
                try:
                    gpus = read_gpus(url, timeout_s=self.scrape_timeout_s)
                except RemoteGpuError as exc:
                    reach.failed(exc)
                    continue
                reach.answered(mask_url(url))
                if not reported:
                    reported = True
                    reports = support_reports(gpus, url) or [TelemetrySupport(
                        source="gpu", available=False, state="no NVIDIA GPU",
                        detail=f"the DCGM exporter at {mask_url(url)} reports no GPU")]
                    for report in reports:
                        self._publish_support(report)
                t = now()
                for gpu in gpus:
                    if gpu.values:
                        self.bus.sample(gpu.source, gpu.values, t)
                        self._stats.bump(gpu.source, "samples")
        except Exception as exc:  # noqa: BLE001 - a sampler bug must not take the run down
            self._stats.bump("gpu", "errors")
            self._notice("gpu", f"remote GPU sampler stopped: {type(exc).__name__}: {exc}")

    def _run_host(self) -> None:
        sampler = HostSampler(self._tree)
        try:
            self._publish_support(sampler.open())
            for _ in self._ticks(self.host_interval_s):
                values = sampler.sample()
                if values:
                    self.bus.sample("host", values)
                    self._stats.bump("host", "samples")
                self._stats.set("host", "errors", sampler.errors)
        except Exception as exc:  # noqa: BLE001
            self._stats.bump("host", "errors")
            self._notice("host", f"host sampler stopped: {type(exc).__name__}: {exc}")

    def _run_engine(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._engine_task = loop.create_task(self._engine_loop())
            if self._stop.is_set():
                self._engine_task.cancel()
            loop.run_until_complete(self._engine_task)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001
            self._stats.bump("engine", "errors")
            self._notice("engine", f"engine scraper stopped: {type(exc).__name__}: {exc}")
        finally:
            self._loop = None
            loop.close()

    async def _engine_loop(self) -> None:
        assert self.metrics_url is not None and self.metric_names is not None
        scraper = EngineScraper(self.metrics_url, self.metric_names, self.api_key, self.scrape_timeout_s,
                                also=self.also_metrics_urls)
        deriver = RateDeriver(min_interval_s=min(0.5, self.engine_interval_s / 2))
        reported_support = False
        reach = _Reachability(self._stats, self._notice, "engine", "engine metrics")
        interval = self.engine_interval_s
        async with aiohttp.ClientSession() as session:
            next_t = time.monotonic()
            while not self._stop.is_set():
                sent = now()
                try:
                    text = await scraper.fetch_text(session)
                    received = now()  # before parsing, which is our time, not the engine's
                    scrape = scraper.parse(text)
                except ScrapeError as exc:
                    reach.failed(exc)
                else:
                    # The engine read its counters somewhere between our request and its answer,
                    # which under load can be far apart: the midpoint is the best estimate.
                    t = ((sent[0] + received[0]) / 2, (sent[1] + received[1]) / 2)
                    values, reset_notice = deriver.update(scrape, t[0])
                    reach.answered(self.metrics_url)
                    if reset_notice:
                        self._notice("engine", reset_notice)
                        self._stats.set("engine", "counter_resets", deriver.resets)
                    if not reported_support:
                        reported_support = True
                        supported, unsupported = support(scraper.map.names, scrape)
                        self._publish_support(TelemetrySupport(
                            source="engine", available=True, url=self.metrics_url, supported=supported,
                            unsupported=unsupported, detail=f"{len(supported)} quantities from {self.metrics_url}"))
                    if values:
                        self.bus.sample("engine", values, t)
                        self._stats.bump("engine", "samples")
                next_t += interval
                delay = next_t - time.monotonic()
                if delay <= 0:
                    next_t, delay = time.monotonic() + interval, interval
                await asyncio.sleep(delay)
