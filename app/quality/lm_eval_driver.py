"""Runs inside lm-eval's own venv (the managed ``lm-eval`` tool), never imported by tunebench:
``python lm_eval_driver.py REQUEST.json RESULT.json``.

It checks each task before any request is sent, so that each problem is one line and the other
tasks still run: a name neither lm-eval nor the given task folders know, a task whose data is not
on this machine (lm-eval runs offline here), a loglikelihood (multiple-choice) task on an engine
that returns no prompt logprobs, or one without a local tokenizer. Then it evaluates the rest with
lm-eval's ``local-completions`` model against the engine's ``/v1/completions`` (the API key comes
in ``OPENAI_API_KEY``, which that model reads), and writes lm-eval's results as JSON. Only the
standard library and lm-eval are imported: this file runs with that venv's interpreter.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

LOGLIKELIHOOD_TYPES = frozenset({"loglikelihood", "loglikelihood_rolling", "multiple_choice"})
"""Output types lm-eval scores from the logprobs of given text: the request echoes the prompt."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _tasks_in(tree: Any) -> list[Any]:
    """The Task objects of ``get_task_dict``'s answer (a group maps to a dict of its tasks)."""
    if isinstance(tree, dict):
        return [task for value in tree.values() for task in _tasks_in(value)]
    return [tree] if tree is not None else []


def _output_type(task: Any) -> str:
    return str(getattr(task, "OUTPUT_TYPE", None) or getattr(getattr(task, "config", None), "output_type", ""))


def evaluate(request: dict[str, Any]) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager, get_task_dict

    errors: list[str] = []
    manager = TaskManager(include_path=request.get("include_paths") or None)
    runnable: list[str] = []
    needs_tokenizer = False
    for name in request["tasks"]:
        if not manager.match_tasks([name]):
            where = ", ".join(request.get("user_paths") or []) or "none given"
            errors.append(f"task {name}: unknown: neither lm-eval nor the task folders ({where}) define it")
            continue
        try:
            tasks = _tasks_in(get_task_dict([name], manager))
        except Exception as exc:  # noqa: BLE001 - datasets raises many kinds for data that is not there
            errors.append(f"task {name}: its data is not on this machine ({_first_line(exc)}); tunebench runs "
                          "lm-eval offline: give a task whose data is local (a task folder with its files) or one "
                          "whose data set is already in the Hugging Face cache")
            continue
        scored = sorted({_output_type(t) for t in tasks} & LOGLIKELIHOOD_TYPES)
        if scored and not request.get("prompt_logprobs", True):
            errors.append(f"task {name}: a {'/'.join(scored)} task scores the logprobs of given answers, which "
                          f"{request.get('engine') or 'this engine'} does not return (no echo of the prompt's "
                          "logprobs): run it on vLLM, or choose a generate-until task")
            continue
        if scored and not request.get("tokenizer"):
            errors.append(f"task {name}: a {'/'.join(scored)} task needs the model's tokenizer on this machine, "
                          "and the engine's model is not a local directory")
            continue
        needs_tokenizer = needs_tokenizer or bool(scored)
        runnable.append(name)
    doc: dict[str, Any] = {"version": lm_eval.__version__, "errors": errors, "results": {}, "n-samples": {},
                           "output_types": {}}
    if not runnable:
        return doc
    model_args: dict[str, Any] = {"base_url": request["base_url"], "model": request["model"],
                                  "num_concurrent": request.get("num_concurrent", 1),
                                  "timeout": int(request.get("request_timeout_s", 300)), "max_retries": 2}
    if needs_tokenizer:
        model_args.update(tokenizer=request["tokenizer"], tokenizer_backend="huggingface")
    else:
        model_args.update(tokenizer_backend="none")
    started = time.monotonic()
    try:
        out = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=runnable,
                                      task_manager=manager, limit=request.get("limit"), log_samples=False)
    except Exception as exc:  # noqa: BLE001 - the engine refused, timed out or went away: one line
        errors.append(f"tasks {', '.join(runnable)}: lm-eval failed against the engine: {_first_line(exc)}")
        return doc
    doc.update(results=out.get("results") or {}, **{"n-samples": out.get("n-samples") or {}},
               output_types={k: v.get("output_type") for k, v in (out.get("configs") or {}).items()},
               wall_s=time.monotonic() - started)
    return doc


def main(argv: list[str]) -> int:
    request_path, result_path = argv[1], argv[2]
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    try:
        doc = evaluate(request)
    except Exception as exc:  # noqa: BLE001 - lm-eval itself broke: still one line for tunebench
        doc = {"errors": [f"lm-eval failed: {_first_line(exc)}"], "results": {}}
    with open(result_path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
