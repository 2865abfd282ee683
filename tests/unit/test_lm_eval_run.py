"""The lm-eval step's edges without lm-eval or an engine: a missing tool or task folder is a line
in the run's notes and stored figures while the speed run completes, the task options are checked
before anything starts, and a cancel ends the lm-eval process."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.cli import main
from app.quality import lm_eval_run
from app.quality.lm_eval_run import DEMO_TASK
from app.quality.task_accuracy import SUMMARY_KEY, stored_task_eval
from app.store import RunStore
from engine_adapters.runtimes import MANAGED_TOOLS
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer


def test_without_the_tool_the_run_completes_and_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    missing = dataclasses.replace(MANAGED_TOOLS["lm-eval"], version="0-not-installed")
    monkeypatch.setitem(MANAGED_TOOLS, "lm-eval", missing)
    profile = tmp_path / "p.toml"
    profile.write_text('name = "tasks"\n[workload]\nnum_requests = 3\n[load]\nconcurrency = 1\n')
    out = tmp_path / "r.json"
    with FakeOpenAIServer(FakeBehaviour(api_key="k1")) as server:
        code = main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--json", str(out),
                     "--no-telemetry", "--db", str(tmp_path / "runs.db"), "--tasks", DEMO_TASK,
                     "--task-path", str(tmp_path / "no-such-folder"), "--task-limit", "5"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "lm-eval: lm-eval is not installed: run `tunebench engine install lm-eval`" in text
    assert f"lm-eval: task folder {tmp_path / 'no-such-folder'} does not exist" in text
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and data["task_eval"]["results"] == []
    with RunStore(tmp_path / "runs.db") as store:
        run = store.get_run(data["run_id"])
    assert run.status == "completed" and run.metrics.get("requests_total") == 3
    stored = stored_task_eval(run.summary)
    assert stored is not None and stored.tasks == [DEMO_TASK] and stored.limit == 5
    assert len(stored.errors) == 2 and all("\n" not in e for e in stored.errors)
    assert run.summary[SUMMARY_KEY]["tool"] == f"lm-eval {missing.version}"


def test_task_options_need_tasks_and_are_refused_before_anything_starts(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('name = "x"\n')
    assert main(["run", str(profile), "--endpoint", "http://127.0.0.1:9", "--task-limit", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--task-path and --task-limit go with --tasks" in err
    assert main(["run", str(profile), "--endpoint", "http://127.0.0.1:9", "--tasks", "x", "--task-limit", "0"]) == 2
    assert "--task-limit" in capsys.readouterr().err


def test_a_cancel_ends_the_lm_eval_process() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    assert lm_eval_run._wait(process, timeout_s=60, cancel=cancel) == "was cancelled"
    assert process.poll() is not None
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert lm_eval_run._wait(slow, timeout_s=0.3, cancel=threading.Event()) == "timed out"
    assert slow.poll() is not None
