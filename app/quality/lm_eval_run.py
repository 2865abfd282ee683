"""Task accuracy with the field's own tool: EleutherAI's lm-evaluation-harness against the running
engine's OpenAI-compatible endpoint, offline, on tasks the user names.

lm-eval runs as a subprocess of its own managed venv (``tunebench engine install lm-eval``:
``engine_adapters.runtimes.MANAGED_TOOLS``), so its data-set stack stays out of tunebench's. The
driver it runs (``lm_eval_driver.py``, beside this file) checks each task first, so an unknown
task, a task whose data is not here, or a multiple-choice task on an engine without prompt
logprobs is one line in :attr:`TaskEval.errors` while the others run, and the run's speed figures
stand either way.

Every evaluation also knows the shipped local task, :data:`DEMO_TASK`: the demo model's own task
(``engine_adapters.demo_task``) written as an lm-eval task, so one definition feeds the model's
training and its scoring. It is generate-until with exact match, so it runs on every engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from app.quality.task_accuracy import TaskAccuracy, TaskEval
from engine_adapters import demo_task
from engine_adapters.runtimes import MANAGED_TOOLS, ManagedRuntime
from engine_adapters.secrets import mask_text

DEMO_TASK = "tunebench_demo_repeat"
"""The shipped local task's name (what ``--tasks`` takes)."""
DEMO_TASK_DOCUMENTS = 100
"""Examples in the shipped task (its test split); ``--task-limit`` takes the first N."""
DRIVER = Path(__file__).with_name("lm_eval_driver.py")
TOOL = "lm-eval"
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1"}
"""No hub is reachable here or at many customers: data and tokenizers come from this machine."""
STOP_GRACE_S = 5.0


class TaskEvalRequest(BaseModel):
    """Which tasks to score after a run's load levels, and how many documents of each."""

    tasks: list[str] = Field(min_length=1)
    include_paths: list[str] = Field(default_factory=list)
    """Folders of the user's own task YAML files (lm-eval's ``--include_path``)."""
    limit: int | None = Field(None, ge=1)
    """Documents per task (lm-eval's ``--limit``); None: all of them."""
    timeout_s: float = Field(3600.0, gt=0)
    num_concurrent: int = Field(1, ge=1)


def lm_eval_tool() -> ManagedRuntime:
    return MANAGED_TOOLS[TOOL]


def _longest_answer() -> str:
    longest = max(demo_task.WORDS, key=len)
    return demo_task.example_for([longest] * demo_task.MAX_WORDS).answer


def demo_task_config(data_file: Path) -> dict[str, Any]:
    """The shipped task's lm-eval config. Its score is ``demo_task.is_correct``: the completion up
    to and including the first ``ANSWER_END``, stripped, against the answer stripped (the regex
    filter takes that prefix and strips it). Generation stops at the next prompt's prefix, which
    holds a character no answer has, so it never cuts an answer short; ``max_gen_toks`` is the
    longest answer's length in characters, so any correct answer (a token is at least one
    character) fits."""
    stop = demo_task.PROMPT_PREFIX
    answer_chars = set("".join(demo_task.WORDS)) | {" ", demo_task.ANSWER_END}
    assert set(stop) - answer_chars, "the stop sequence must hold a character no answer has"
    end = re.escape(demo_task.ANSWER_END)
    return {
        "task": DEMO_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{answer | trim}}",
        "generation_kwargs": {"until": [stop], "max_gen_toks": len(_longest_answer()), "do_sample": False,
                              "temperature": 0.0},
        "filter_list": [{"name": "up_to_answer_end", "filter": [
            {"function": "regex", "regex_pattern": f"^[^{end}]*{end}?"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1, "source": "engine_adapters.demo_task"},
    }


def write_demo_task(directory: Path, documents: int = DEMO_TASK_DOCUMENTS) -> Path:
    """The shipped task as lm-eval reads it: ``DEMO_TASK.yaml`` and its data, a JSON-lines file of
    ``demo_task.examples(documents, "test")``. Returns the YAML's path (JSON is YAML)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{DEMO_TASK}.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n"
                            for e in demo_task.examples(documents, "test")), encoding="utf-8")
    config = directory / f"{DEMO_TASK}.yaml"
    config.write_text(json.dumps(demo_task_config(data.resolve()), indent=1) + "\n", encoding="utf-8")
    return config


def _stderr(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None  # "N/A" or NaN: none


def accuracies(doc: dict[str, Any], wall_s: float) -> list[TaskAccuracy]:
    """lm-eval's results (``{task: {"exact_match,filter": v, "exact_match_stderr,filter": se}}``
    and ``n-samples``) as one :class:`TaskAccuracy` per task, metric and filter."""
    out: list[TaskAccuracy] = []
    counts = doc.get("n-samples") or {}
    for task, figures in (doc.get("results") or {}).items():
        if not isinstance(figures, dict):
            continue
        counted = counts.get(task) or {}
        samples = counted.get("effective") if isinstance(counted, dict) else None
        samples = samples if isinstance(samples, int) else figures.get("sample_len")
        for key, value in figures.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(value, int | float):
                continue
            out.append(TaskAccuracy(task=task, metric=metric, filter=filter_name, value=float(value),
                                    stderr=_stderr(figures.get(f"{metric}_stderr,{filter_name}")),
                                    samples=samples if isinstance(samples, int) else 0, wall_s=wall_s))
    return out


def run_task_eval(request: TaskEvalRequest, *, base_url: str, model: str, api_key: str | None,
                  prompt_logprobs: bool, engine: str, tokenizer: str | None,
                  cancel: threading.Event | None = None) -> TaskEval:
    """Score ``request``'s tasks against the engine at ``base_url`` (its root, no ``/v1``).
    Never raises for what a user can fix: each problem is a line in the answer's ``errors``."""
    tool = lm_eval_tool()
    found = TaskEval(tool=f"lm-eval {tool.version}", tasks=list(request.tasks), limit=request.limit)
    folders = []
    for folder in request.include_paths:
        if Path(folder).expanduser().is_dir():
            folders.append(str(Path(folder).expanduser().resolve()))
        else:
            found.errors.append(f"task folder {folder} does not exist")
    if not tool.is_installed():
        found.errors.append(f"lm-eval is not installed: run `tunebench engine install {TOOL}` (a venv of its own "
                            "in the user cache)")
        return found
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tunebench-lm-eval-") as scratch:
        work = Path(scratch)
        write_demo_task(work / "shipped")
        request_file, result_file, log_file = work / "request.json", work / "result.json", work / "lm-eval.log"
        request_file.write_text(json.dumps({
            "base_url": base_url.rstrip("/") + "/v1/completions", "model": model, "tasks": request.tasks,
            "include_paths": [str(work / "shipped"), *folders], "user_paths": folders, "limit": request.limit,
            "prompt_logprobs": prompt_logprobs, "engine": engine, "tokenizer": tokenizer,
            "num_concurrent": request.num_concurrent}), encoding="utf-8")
        env = {**os.environ, **OFFLINE_ENV, "OPENAI_API_KEY": api_key or ""}
        with open(log_file, "wb") as log:
            process = subprocess.Popen([str(tool.interpreter), str(DRIVER), str(request_file), str(result_file)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=scratch)
            stopped = _wait(process, request.timeout_s, cancel or threading.Event())
        wall_s = time.monotonic() - started
        found.wall_s = wall_s
        if stopped:
            found.errors.append(f"lm-eval {stopped} after {wall_s:.0f} s; no task accuracy from this run")
            return found
        try:
            doc = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line][-1:]
            found.errors.append(f"lm-eval exited ({process.returncode}) without results"
                                + (f": {mask_text(tail[0])[:300]}" if tail else ""))
            return found
    found.errors += [mask_text(str(e)) for e in doc.get("errors") or []]
    found.results = accuracies(doc, wall_s)
    return found


def _wait(process: subprocess.Popen[bytes], timeout_s: float, cancel: threading.Event) -> str | None:
    """Wait for the driver; on a cancel or past ``timeout_s``, end it and say which."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        why = "was cancelled" if cancel.is_set() else "timed out" if time.monotonic() > deadline else None
        if why is not None:
            process.terminate()
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return why
        cancel.wait(0.2)
    return None
