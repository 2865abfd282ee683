"""benchmarks/gpu_check.py without a GPU: it exits cleanly, and its measuring pipeline (sampler
during a copy, windows, ratio) is right when driven through the pynvml fake."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.nvml import FakeGpu, FakeNvml

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def load_script():  # type: ignore[no-untyped-def]
    """The script as a module, its folder on the import path as when it runs (it imports repo_path)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.append(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_says_it_is_skipped_without_gpu_or_torch() -> None:
    """Nothing checked is no pass: the script says so and exits with the status `make bench` reads
    as skipped."""
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == load_script().SKIPPED_EXIT != 0, done.stderr
    assert done.stdout.startswith("gpu_check: skipped: no GPU (") and "nothing to check" in done.stdout
    assert done.stderr == ""


def test_make_bench_reads_the_skip_status_as_skipped() -> None:
    recipe = (SCRIPT.parents[1] / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert f"skip_rc={load_script().SKIPPED_EXIT};" in recipe
    assert "skipped=" in recipe and "$$rc -eq $$skip_rc" in recipe


def _copy_on(gpu: FakeGpu, peak: float, util_pct: float):  # type: ignore[no-untyped-def]
    def copy(seconds: float) -> tuple[float, float]:
        gpu.state["dram_bw_util_pct"] = util_pct
        time.sleep(seconds)
        gpu.state["dram_bw_util_pct"] = 0.0
        return util_pct / 100 * peak * seconds, seconds
    return copy


def test_sampler_and_copy_agree_when_gpm_sees_the_copy(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = load_script()
    gpu = FakeGpu.h200()
    peak = 6144 / 8 * 3201e6 * 2
    result = gpu_check.run_check(_copy_on(gpu, peak, 88.0), seconds=3.0, nvml=FakeNvml([gpu]), idle_s=0.4)  # >= 5 samples even when starved
    assert result["ok"] is True and result["ratio"] == pytest.approx(1.0, abs=0.01)
    assert result["samples_during_copy"] >= 5 and result["idle_dram_bw_bytes_per_s"] == 0.0
    gpu_check.print_result(result)
    out = capsys.readouterr().out
    assert "copy achieved            4.33 TB/s" in out and "agree within 15%" in out
    # The planner's ceiling for an H200 is the spec's 4.8 TB/s: a 4.33 TB/s copy is 90% of it.
    assert result["planner_ceiling_holds"] is True
    assert result["copy_fraction_of_planner_ceiling"] == pytest.approx(4.33 / 4.8, abs=0.01)
    assert "planner's ceiling        4.80 TB/s" in out


def test_a_copy_above_the_planners_ceiling_is_a_failure() -> None:
    gpu_check = load_script()
    gpu = FakeGpu.h200()

    def copy(seconds: float) -> tuple[float, float]:  # a copy faster than the card's spec: a wrong table
        time.sleep(seconds)
        return 6e12 * seconds, seconds

    result = gpu_check.run_check(copy, seconds=0.5, nvml=FakeNvml([gpu]), idle_s=0.2)
    assert result["planner_ceiling_holds"] is False


def test_disagreement_is_reported() -> None:
    gpu_check = load_script()
    gpu = FakeGpu.h200()
    peak = 6144 / 8 * 3201e6 * 2

    def copy(seconds: float) -> tuple[float, float]:  # the copy claims twice what the sampler sees
        bytes_moved, taken = _copy_on(gpu, peak, 40.0)(seconds)
        return 2 * bytes_moved, taken

    result = gpu_check.run_check(copy, seconds=1.0, nvml=FakeNvml([gpu]), idle_s=0.2)
    assert result["ok"] is False and result["ratio"] == pytest.approx(0.5, abs=0.02)


def test_pre_hopper_says_there_is_no_bandwidth_to_compare() -> None:
    gpu_check = load_script()
    gpu = FakeGpu.a100()
    result = gpu_check.run_check(_copy_on(gpu, 2e12, 50.0), seconds=0.6, nvml=FakeNvml([gpu]), idle_s=0.2)
    assert result["ok"] is None and "GPM not supported" in result["message"]


def test_no_driver_result() -> None:
    gpu_check = load_script()
    result = gpu_check.run_check(lambda s: (0.0, s), seconds=0.1, nvml=FakeNvml(driver_missing=True), idle_s=0.0)
    assert result["ok"] is None and "no NVIDIA GPU" in result["message"]
