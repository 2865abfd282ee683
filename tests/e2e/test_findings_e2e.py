"""Findings on a real engine (the llamacpp-cpu runtime, the GGUF demo model): a shared system prompt
sent with prefix caching off is found cold, with the feature switched on as the next trial; the same
workload with it on raises no such finding, and explained against the first run, says why it
differs (from the stored runs, as ``tunebench explain`` reads them). A healthy run raises no
warning but a client starved by this shared machine (rightly said), and ``explain`` says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.analysis.findings import Finding, explain, load_run
from app.planner.stored import level_limits
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
from engine_adapters.runtimes import COMPLETE_MARKER, MANAGED_RUNTIMES, demo_model_dir
from tests.e2e.findings_runs import explain_says_it, healthy_run, record

pytestmark = pytest.mark.e2e

RUNTIME = MANAGED_RUNTIMES["llamacpp-cpu"]
ENGINE = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
WORKLOAD = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=128, num_requests=16,
                          input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=8))


@pytest.fixture(scope="module")
def gguf() -> Path:
    if not RUNTIME.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    return ensure_gguf_demo_model(str(RUNTIME.interpreter))


def _recorded_run(engine_pool, store: RunStore, prefix_caching: bool) -> int:  # type: ignore[no-untyped-def]
    engine = engine_pool.get(Features(prefix_caching=prefix_caching, max_model_len=1024), ENGINE)
    return record(engine, store, WORKLOAD, LoadConfig(concurrency=2),
                  name=f"prefix {'on' if prefix_caching else 'off'}")


def _rules(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def test_a_cold_prefix_cache_on_llamacpp_is_found(engine_pool, gguf: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with RunStore(tmp_path / "runs.db") as store:
        off = _recorded_run(engine_pool, store, prefix_caching=False)
        on = _recorded_run(engine_pool, store, prefix_caching=True)
        cold = explain(load_run(store, off, level_limits))
        warm = explain(load_run(store, on, level_limits), load_run(store, off, level_limits))
    print("\n".join(f"off: {f.rule}: {f.explanation}" for f in cold))
    print("\n".join(f"on: {f.rule}: {f.explanation}" for f in warm))
    prefix = next(f for f in cold if f.rule == "prefix_cold")
    assert prefix.severity == "warning" and prefix.suggestion == {"features.prefix_caching": True}
    share = next(e for e in prefix.evidence if e.figure == "prompt tokens served from the prefix cache")
    assert share.value < 5.0  # llama.cpp counts cached prompt tokens: none were, with the feature off
    assert "prefix_cold" not in _rules(warm)
    moved = next(f for f in warm if f.rule == "changed_prefix_hits")
    assert "prefill did" in moved.explanation and "features.prefix_caching False -> True" in moved.explanation
    assert moved.evidence[1].value >= 50.0  # most of each prompt is the shared prefix, cached after the first


def test_a_healthy_llamacpp_run_raises_no_warning(engine_pool, gguf: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    engine = engine_pool.get(Features(prefix_caching=True, max_model_len=1024), ENGINE)  # the "on" engine above
    workload = WORKLOAD.model_copy(update={"num_requests": 48, "output_len": LengthSpec(mean=32)})
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        run_id = healthy_run(engine, store, workload, LoadConfig(concurrency=2, warmup_requests=2))
    explain_says_it(db, run_id, capsys)
