"""Runs on different hardware (a cluster's nodes may differ) are never called a fair comparison:
Compare (its table and its JSON) and the ladder's table say so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.analysis.compare import compare_runs, hardware_model, unfair_hardware
from app.cli.ladder_cmds import format_ladder_table
from app.ladder.state import LadderState
from app.store import RunStore

REPO = Path(__file__).resolve().parents[2]
H100 = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}], "cpu_model": "Xeon"}
A100 = {"gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB"}], "cpu_model": "Xeon"}


def _stored(store: RunStore, name: str, hardware: dict[str, object]) -> int:
    run_id = store.create_run(name=name, engine_kind="vllm", model="m", started_at=1.9e9, t0_mono=0.0,
                              config={"name": name, "engine": {"kind": "vllm"}}, hardware=hardware)
    store.finish_run(run_id, "completed", None, {}, 1.9e9 + 5.0)
    return run_id


def test_the_hardware_that_matters_is_the_gpu_models_or_the_cpu() -> None:
    assert hardware_model(H100) == "NVIDIA H100 80GB HBM3"
    assert hardware_model({"gpus": [], "cpu_model": "EPYC 9654"}) == "CPU EPYC 9654"
    assert unfair_hardware([H100, dict(H100, hostname="other-node")]) is None  # another node, the same GPU
    assert unfair_hardware([H100, A100]) == ("not a fair comparison: the runs ran on different hardware "
                                             "(NVIDIA A100-SXM4-80GB; NVIDIA H100 80GB HBM3)")


def test_compare_says_runs_on_different_gpu_models_are_not_a_fair_comparison(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        h100, a100, h100_again = _stored(store, "a", H100), _stored(store, "b", A100), _stored(store, "c", H100)
        assert compare_runs(store, [h100, h100_again], series=False).unfair is None
        comparison = compare_runs(store, [h100, a100], series=False)
    assert comparison.unfair is not None and "different hardware" in comparison.unfair
    assert comparison.to_dict()["unfair"] == comparison.unfair
    out = subprocess.run([sys.executable, "-m", "app.cli", "compare", str(h100), str(a100), "--db", str(db)],
                         capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "warning: not a fair comparison: the runs ran on different hardware" in out.stdout


def test_the_ladder_table_warns_when_its_steps_ran_on_different_hardware() -> None:
    state = LadderState(name="l", ladder_id="x", started_wall_s=1.9e9, unfair=unfair_hardware([H100, A100]))
    assert "WARNING: not a fair comparison" in format_ladder_table(state)
    assert "not a fair comparison" not in format_ladder_table(LadderState(name="l", ladder_id="x", started_wall_s=1.9e9))
