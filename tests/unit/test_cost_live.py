"""The live cost: a running run is priced from its ``RunStarted`` on the GPUs (or cores) and price
its stored run will be priced on, so the live tile and the stored figure differ only by the
throughput they are priced at. Figures are hand-computed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.cost import live_cost, live_cost_basis, price_table, run_cost
from app.events import RunFinished, RunStarted
from app.profiles import load_profile, resolve_profile
from app.recording import RunRecorder
from app.store import RunStore
from engine_adapters.config import EngineConfig, Features, RuntimeConfig

GPU_CONFIG = RunConfig(name="tp2", engine=EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct",
                                                      runtime=RuntimeConfig(kind="executable", executable="vllm")),
                       features=Features(tensor_parallel_size=2))
H100S = {"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]}


def _started(config: RunConfig, hardware: dict[str, object], env: dict[str, str] | None = None,
             version: str = "0.11.0") -> RunStarted:
    return RunStarted(run_id=f"live-{config.name}", name=config.name, config=config, engine_kind="vllm",
                      model=config.engine.model, env=env or {}, engine_version=version, hardware=hardware,
                      started_wall_s=time.time())


def test_a_running_gpu_run_is_priced_on_its_gpus_as_its_stored_run_is(tmp_path: Path) -> None:
    started = _started(GPU_CONFIG, H100S)
    basis = live_cost_basis(started, price_table(["H100=3.60"]))
    assert (basis.units, basis.unit, basis.device) == (2, "GPU", "NVIDIA H100 80GB HBM3")  # TP 2: two GPUs
    figure = live_cost(basis, 1000.0)
    assert figure.usd == pytest.approx(2 * 3.60 / (1000 * 3600) * 1e6)  # $2.00
    assert live_cost(basis, None).usd is None and live_cost(basis, 0.0).reason == "the measured throughput is zero"
    bus = Bus()
    recorder = RunRecorder(bus, RunStore(tmp_path / "runs.db"))
    bus.emit(started)
    bus.emit(RunFinished(run_id=started.run_id, status="completed", ended_wall_s=time.time()))
    recorder.close()
    with RunStore(tmp_path / "runs.db") as store:
        stored = run_cost(store.get_run(recorder.recorded[0]), price_table(["H100=3.60"]), 1000.0, None)
    assert stored.output.usd == figure.usd and stored.price_text() == basis.price_text()


def test_a_running_cpu_run_is_priced_on_the_cores_its_engine_was_bound_to() -> None:
    config = load_profile(resolve_profile("cpu-demo"))
    basis = live_cost_basis(_started(config, {"cpu_model": "x86", "cpu_count_logical": 8},
                                     {"VLLM_CPU_OMP_THREADS_BIND": "0-6"}, "0.32.0"), price_table(["cpu=0.05"]))
    assert (basis.units, basis.unit) == (7, "core")
    assert live_cost(basis, 70.0).usd == pytest.approx(7 * 0.05 / (70 * 3600) * 1e6)


def test_a_running_run_that_cannot_be_priced_says_why() -> None:
    basis = live_cost_basis(_started(GPU_CONFIG, {}), price_table())
    assert basis.price is None and live_cost(basis, 1000.0).usd is None
    assert live_cost(basis, 1000.0).reason == "the run records no GPU (an engine on another machine?)"
