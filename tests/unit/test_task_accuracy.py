"""Task accuracy without an engine: the shipped lm-eval task scores as ``demo_task.is_correct``
does, lm-eval's results become stored figures, and Compare's noise verdict is the stated bound."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.analysis.compare import compare_runs
from app.cli import main
from app.quality.lm_eval_run import DEMO_TASK, accuracies, demo_task_config, write_demo_task
from app.quality.task_accuracy import (
    SUMMARY_KEY,
    TaskAccuracy,
    TaskEval,
    compare_task_accuracy,
    comparison_lines,
    difference_verdict,
    noise_bound,
    stored_task_eval,
)
from app.store import RunStore
from engine_adapters import demo_task


def lm_eval_score(config: dict[str, object], doc: dict[str, str], completion: str) -> bool:
    """What lm-eval computes from the task config for one completion: its stop sequences cut the
    text (the stop itself excluded), the regex filter takes ``findall(...)[0]`` and strips it, and
    exact match compares with the rendered target (``{{answer | trim}}``)."""
    stops = config["generation_kwargs"]["until"]  # type: ignore[index]
    cut = min([completion.find(s) for s in stops if s in completion] or [len(completion)])
    text = completion[:cut]
    steps = config["filter_list"][0]["filter"]  # type: ignore[index]
    pattern = next(step["regex_pattern"] for step in steps if step["function"] == "regex")
    found = re.findall(pattern, text)
    prediction = found[0].strip() if found else "[invalid]"
    assert config["doc_to_target"] == "{{answer | trim}}"
    return prediction == doc["answer"].strip()


completions = st.lists(st.sampled_from([*demo_task.WORDS, " ", "  ", ".", "\n", "repeat:", "=>", "x."]),
                       max_size=12).map("".join)


@given(index=st.integers(0, 49), completion=completions, correct=st.booleans())
def test_the_shipped_task_scores_exactly_as_is_correct(index: int, completion: str, correct: bool) -> None:
    example = demo_task.examples(50)[index]
    if correct:  # the right answer, with whatever follows it
        completion = example.answer + completion
    config = demo_task_config(Path("/data.jsonl"))
    doc = {"prompt": example.prompt, "answer": example.answer}
    assert lm_eval_score(config, doc, completion) == demo_task.is_correct(example, completion)


def test_the_shipped_task_is_the_demo_tasks_test_split_and_fits_any_correct_answer(tmp_path: Path) -> None:
    config_path = write_demo_task(tmp_path, documents=30)
    config = json.loads(config_path.read_text())
    assert config["task"] == DEMO_TASK and config["output_type"] == "generate_until"
    rows = [json.loads(line) for line in Path(config["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()]
    assert rows == [{"prompt": e.prompt, "answer": e.answer} for e in demo_task.examples(30, "test")]
    longest = max(len(e.answer) for e in demo_task.examples(2000, "test"))
    assert longest <= config["generation_kwargs"]["max_gen_toks"]
    assert config["metric_list"][0]["metric"] == "exact_match"


LM_EVAL_RESULTS = {  # the shape lm-eval 0.4.13 writes (results_*.json), trimmed
    "results": {
        DEMO_TASK: {"alias": DEMO_TASK, "name": DEMO_TASK, "sample_len": 10, "exact_match,up_to_answer_end": 0.7,
                    "exact_match_stderr,up_to_answer_end": 0.15275252316519466},
        "tiny_mc": {"alias": "tiny_mc", "acc,none": 0.5, "acc_stderr,none": "N/A", "acc_norm,none": 0.25,
                    "acc_norm_stderr,none": 0.1},
    },
    "n-samples": {DEMO_TASK: {"original": 100, "effective": 10}, "tiny_mc": {"original": 4, "effective": 4}},
}


def test_lm_evals_results_become_one_figure_per_task_metric_and_filter() -> None:
    found = {(a.task, a.metric): a for a in accuracies(LM_EVAL_RESULTS, wall_s=12.5)}
    assert set(found) == {(DEMO_TASK, "exact_match"), ("tiny_mc", "acc"), ("tiny_mc", "acc_norm")}
    demo = found[(DEMO_TASK, "exact_match")]
    assert (demo.value, demo.stderr, demo.samples, demo.filter, demo.wall_s) == (0.7, 0.15275252316519466, 10,
                                                                                "up_to_answer_end", 12.5)
    assert found[("tiny_mc", "acc")].stderr is None  # "N/A": no error, not a zero error
    assert found[("tiny_mc", "acc_norm")].samples == 4


def _acc(value: float, stderr: float | None, task: str = DEMO_TASK) -> TaskAccuracy:
    return TaskAccuracy(task=task, metric="exact_match", value=value, stderr=stderr, samples=100, wall_s=1.0)


def test_a_difference_is_beyond_noise_only_past_the_stated_bound() -> None:
    bound = 1.96 * math.sqrt(0.03**2 + 0.04**2)
    assert noise_bound(0.03, 0.04) == pytest.approx(bound)
    assert difference_verdict(_acc(0.90, 0.03), _acc(0.90 - bound * 1.01, 0.04)) == "beyond noise"
    assert difference_verdict(_acc(0.90, 0.03), _acc(0.90 - bound * 0.99, 0.04)) == "within noise"
    assert difference_verdict(_acc(0.90, 0.03), _acc(0.90 + bound * 1.01, 0.04)) == "beyond noise"
    assert difference_verdict(_acc(0.90, None), _acc(0.10, 0.01)) == "no error given"
    assert difference_verdict(_acc(0.90, 0.03), None) == "not measured"


def test_compare_rows_come_from_stored_summaries() -> None:
    def summary(*results: TaskAccuracy) -> dict[str, object]:
        return {"levels": [], SUMMARY_KEY: TaskEval(tool="lm-eval 0.4.13", tasks=[DEMO_TASK],
                                                    results=list(results)).model_dump(mode="json")}

    summaries = [summary(_acc(0.95, 0.02)), summary(_acc(0.60, 0.05)), {"levels": []}, summary(_acc(0.94, 0.02))]
    rows = compare_task_accuracy(summaries, baseline=0)
    assert len(rows) == 1
    row = rows[0]
    assert row.verdicts == ["baseline", "beyond noise", "not measured", "within noise"]
    assert row.differences[1] == pytest.approx(-0.35) and row.differences[2] is None
    lines = comparison_lines(rows, ["#1 (base)", "#2", "#3", "#4"])
    assert lines[0] == f"{DEMO_TASK} exact_match:"
    assert "-0.350 against the baseline: beyond noise" in lines[2] and lines[3] == "  #3: not measured"
    assert compare_task_accuracy([{"levels": []}, None], baseline=0) == []


def test_a_stored_summary_without_or_with_a_broken_entry_has_no_task_eval() -> None:
    assert stored_task_eval({"levels": []}) is None and stored_task_eval(None) is None
    assert stored_task_eval({SUMMARY_KEY: {"results": [{"task": "x"}]}}) is None
    again = stored_task_eval({SUMMARY_KEY: TaskEval(results=[_acc(0.5, 0.1)]).model_dump(mode="json")})
    assert again is not None and again.results[0].value == 0.5


def test_compare_shows_the_accuracy_with_its_verdict_and_never_as_a_plain_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        ids = []
        for name, value in (("bf16", 0.95), ("q4_0", 0.55)):
            run_id = store.create_run(name=name, engine_kind="llamacpp", model="tunebench:demo", started_at=1.9e9,
                                      config={"name": name})
            found = TaskEval(tool="lm-eval 0.4.13", tasks=[DEMO_TASK], limit=40, results=[_acc(value, 0.05)],
                             wall_s=12.0)
            store.finish_run(run_id, "completed", summary={SUMMARY_KEY: found.model_dump(mode="json")})
            ids.append(str(run_id))
        assert not [m.name for m in compare_runs(store, ids).metrics if m.name.startswith(SUMMARY_KEY)]
    assert main(["compare", *ids, "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "task accuracy (lm-eval; beyond noise: |a - b| > 1.96 x sqrt(se_a^2 + se_b^2)):" in out
    assert "0.550 ± 0.050 (100 samples), -0.400 against the baseline: beyond noise, noise ±0.139" in out
    assert main(["compare", *ids, "--db", str(db), "--json", "--no-series"]) == 0
    rows = json.loads(capsys.readouterr().out)["task_accuracy"]
    assert [r["verdicts"] for r in rows] == [["baseline", "beyond noise"]]
