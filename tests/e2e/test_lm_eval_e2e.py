"""lm-evaluation-harness for real (the managed ``lm-eval`` tool) against the shared engines, after
a run's load: the shipped task scores on vLLM and on llama.cpp, its accuracy is stored with its
standard error and sample count, Compare says whether two runs differ beyond noise, and bad tasks
(unknown, data missing, multiple-choice on llama.cpp) are one line each while the speed run is
still stored. Few documents (``LIMIT``) keep it short; one lm-eval pass per engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bus import Bus
from app.cli import main
from app.config import RunConfig
from app.quality.lm_eval_run import DEMO_TASK, TaskEvalRequest, lm_eval_tool
from app.quality.task_accuracy import SUMMARY_KEY, TaskAccuracy, TaskEval, stored_task_eval
from app.recording import RunRecorder
from app.runner import Runner, RunResult
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e

LIMIT = 16
WORKLOAD = WorkloadConfig(kind="random", num_requests=6, input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
LOAD = LoadConfig(concurrency=2, warmup_requests=0)
LLAMACPP = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
BAD_TASKS = ("no_such_task", "missing_data")


def _write_user_tasks(folder: Path) -> Path:
    """A user's task folder: a tiny multiple-choice task with its data, and one whose data file is missing."""
    folder.mkdir()
    data = folder / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps({"question": f"repeat: {w} =>", "choices": [f" {w}.", " dog.", " two."],
                                        "label": 0}) + "\n" for w in ("fox", "lazy", "three", "quick")))
    common = {"test_split": "test", "dataset_path": "json", "doc_to_text": "{{question}}"}
    (folder / "tiny_mc.yaml").write_text(json.dumps({
        "task": "tiny_mc", **common, "dataset_kwargs": {"data_files": {"test": str(data)}},
        "output_type": "multiple_choice", "doc_to_choice": "choices", "doc_to_target": "label",
        "metric_list": [{"metric": "acc"}]}))
    (folder / "missing_data.yaml").write_text(json.dumps({
        "task": "missing_data", **common, "dataset_kwargs": {"data_files": {"test": str(folder / "gone.jsonl")}},
        "output_type": "generate_until", "doc_to_target": "{{answer}}", "metric_list": [{"metric": "exact_match"}]}))
    return folder


def _run(store: RunStore, engine: EngineProcess, name: str, tasks: TaskEvalRequest) -> tuple[RunResult, int]:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    config = RunConfig(name=name, engine=engine.engine, features=engine.features, workload=WORKLOAD, load=LOAD)
    try:
        result = Runner(config, bus, engine=engine, telemetry=False, task_eval=tasks).run()
    finally:
        recorder.close()
    assert recorder.recorded, recorder.errors
    return result, recorder.recorded[-1]


@pytest.fixture(scope="module")
def evaluated(engine_pool, demo_engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One run on each engine, each followed by one lm-eval pass over the shipped task, the
    user's multiple-choice task and the two bad ones; both recorded in one store."""
    if not lm_eval_tool().is_installed():
        pytest.fail("the lm-eval tool is missing: run `make tools` (tunebench engine install lm-eval)")
    folder = _write_user_tasks(tmp_path_factory.mktemp("tasks") / "mine")
    tasks = TaskEvalRequest(tasks=[DEMO_TASK, "tiny_mc", *BAD_TASKS], include_paths=[str(folder)], limit=LIMIT,
                            num_concurrent=4)
    db = tmp_path_factory.mktemp("lm-eval-store") / "runs.db"
    with RunStore(db) as store:
        vllm = _run(store, demo_engine, "vllm with tasks", tasks)
        llamacpp = _run(store, engine_pool.get(Features(), LLAMACPP), "llama.cpp with tasks", tasks)
    return {"vllm": vllm, "llamacpp": llamacpp, "db": db}


def _shipped(found: TaskEval | None) -> TaskAccuracy:
    assert found is not None
    return next(a for a in found.results if a.task == DEMO_TASK and a.metric == "exact_match")


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_the_shipped_task_is_scored_and_stored_with_its_error_beside_the_speed_run(evaluated, engine: str) -> None:  # type: ignore[no-untyped-def]
    result, run_id = evaluated[engine]
    assert result.status == "completed", result.reason
    assert result.levels and result.levels[0].summary.completed == WORKLOAD.num_requests
    found = result.task_eval
    shipped = _shipped(found)
    assert result.ended_wall_s is not None
    print(f"\n{engine}: the run took {result.ended_wall_s - result.started_wall_s:.1f} s, lm-eval {shipped.wall_s:.1f} s "
          f"of it: {shipped.text()}")
    assert shipped.samples == LIMIT and 0.0 <= shipped.value <= 1.0
    assert shipped.stderr is not None and shipped.stderr >= 0.0
    with RunStore(evaluated["db"]) as store:
        stored = store.get_run(run_id)
    assert stored.status == "completed"
    assert stored_task_eval(stored.summary) == found  # the stored figures are the run's
    assert stored.metrics.get("requests_total") == WORKLOAD.num_requests  # and the speed run is there too


def test_bad_tasks_are_one_line_each_and_multiple_choice_needs_prompt_logprobs(evaluated) -> None:  # type: ignore[no-untyped-def]
    vllm, llamacpp = evaluated["vllm"][0].task_eval, evaluated["llamacpp"][0].task_eval
    assert vllm is not None and llamacpp is not None
    for found in (vllm, llamacpp):
        assert all("\n" not in e and "Traceback" not in e for e in found.errors), found.errors
        by_task = {e.split(":")[0].removeprefix("task "): e for e in found.errors}
        assert set(by_task) - {"tiny_mc"} == set(BAD_TASKS) and len(by_task) == len(found.errors), found.errors
        assert "unknown" in by_task["no_such_task"] and "not on this machine" in by_task["missing_data"]
    # vLLM echoes the prompt's logprobs: the multiple-choice task is scored there, with the model's tokenizer...
    mc = [a for a in vllm.results if a.task == "tiny_mc" and a.metric == "acc"]
    assert len(mc) == 1 and mc[0].samples == 4, vllm.errors
    # ...and refused on llama.cpp, in one line that says why and where it runs.
    refused = [e for e in llamacpp.errors if e.startswith("task tiny_mc")]
    assert len(refused) == 1 and "llama.cpp" in refused[0] and "vLLM" in refused[0], llamacpp.errors
    assert not [a for a in llamacpp.results if a.task == "tiny_mc"]


def test_compare_says_whether_the_accuracy_difference_is_beyond_noise(evaluated, capsys) -> None:  # type: ignore[no-untyped-def]
    first, second = evaluated["vllm"][1], evaluated["llamacpp"][1]
    db = str(evaluated["db"])
    assert main(["compare", str(first), str(second), "--db", db, "--json", "--no-series"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["task_accuracy"] if r["task"] == DEMO_TASK)
    assert row["verdicts"][0] == "baseline" and row["verdicts"][1] in ("beyond noise", "within noise")
    a, b = (_shipped(evaluated[e][0].task_eval) for e in ("vllm", "llamacpp"))
    assert a.stderr is not None and b.stderr is not None
    expected = "beyond noise" if abs(a.value - b.value) > 1.96 * (a.stderr**2 + b.stderr**2) ** 0.5 else "within noise"
    assert row["verdicts"][1] == expected
    assert main(["compare", str(first), str(second), "--db", db]) == 0
    text = capsys.readouterr().out
    assert "task accuracy (lm-eval" in text and f"{expected}" in text
    assert main(["runs", "show", str(first), "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"][SUMMARY_KEY]["results"]


def test_the_trained_demo_model_scores_high_at_baseline(evaluated) -> None:  # type: ignore[no-untyped-def]
    """Runs against whichever demo model is installed: the trained one must do its own task."""
    for engine in ("vllm", "llamacpp"):
        shipped = _shipped(evaluated[engine][0].task_eval)
        assert shipped.value >= 0.9, f"{engine}: {shipped.text()}"
