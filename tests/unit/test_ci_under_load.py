"""`.ci/under-load`, the driver behind the suite's "three runs in a row under a CPU burner" proof.

The real suite cannot run inside itself, so these tests give the driver a small git repository
whose `.ci/run` stands in for `make test`: it reports where it ran and which burners were alive,
prints a pytest-like summary, and fails when told to. What is checked is the driver's own promise:
a fresh clone of the commit per run, the asked-for burners alive during each run and gone after,
one summary line per run, and a non-zero exit when any run failed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_export_scripts import shellcheck

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = REPO_ROOT / ".ci" / "under-load"

# Stands in for `make test`. Its nearest ancestor running `under-load` is the driver (bash may or
# may not fork for the `( cd ... && bash .ci/run )` subshell); the driver's other children, those
# that are not this run's ancestors, are its burners.
STAND_IN_RUN = """#!/usr/bin/env bash
set -euo pipefail
driver=$$; mine=$$
until ps -ww -o args= -p "$driver" | grep -q under-load; do
    driver=$(ps -o ppid= -p "$driver" | tr -d ' '); mine="$mine $driver"
done
n=$(cat "$REPORT/count" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$REPORT/count"
pwd > "$REPORT/where-$n"
echo "CI=${CI:-}" >> "$REPORT/where-$n"
pgrep -P "$driver" | grep -vxF -f <(tr ' ' '\\n' <<< "$mine") > "$REPORT/burners-$n" || true
if [[ -e "$REPORT/fail-$n" ]]; then echo "1 failed, 41 passed in 0.10s"; exit 1; fi
echo "42 passed in 0.10s"
"""


def _stand_in_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(DRIVER, repo / ".ci" / "under-load")
    (repo / ".ci" / "run").write_text(STAND_IN_RUN)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "stand-in"], check=True)
    return repo


def _drive(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    report = tmp_path / "report"
    report.mkdir(exist_ok=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "REPORT": str(report), "TMPDIR": str(scratch), "UNDER_LOAD_DIR": str(tmp_path / "logs")}
    # Files, not pipes: a burner that outlived the driver would hold a pipe open and hang the test.
    with (tmp_path / "stdout").open("w+") as out, (tmp_path / "stderr").open("w+") as err:
        done = subprocess.run(["bash", str(repo / ".ci" / "under-load"), *args], env=env, stdout=out,
                              stderr=err, timeout=120, check=False)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(done.args, done.returncode, out.read(), err.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def test_driver_passes_shellcheck() -> None:
    shellcheck(DRIVER)
    shellcheck(REPO_ROOT / ".ci" / "run")


@pytest.mark.parametrize("args", [["0"], ["x"], ["3", "-1"], ["1", "2", "3"], ["21"]])
def test_bad_arguments_get_the_usage_and_run_nothing(tmp_path: Path, args: list[str]) -> None:
    repo = _stand_in_repo(tmp_path)
    result = _drive(repo, tmp_path, *args)
    assert result.returncode == 2
    assert "usage: .ci/under-load [RUNS [BURNERS]]" in result.stderr
    assert not (tmp_path / "report" / "count").exists()


def test_each_run_is_a_fresh_clone_with_its_burners_and_none_survive(tmp_path: Path) -> None:
    repo = _stand_in_repo(tmp_path)
    result = _drive(repo, tmp_path, "2", "2")
    report = tmp_path / "report"
    assert result.returncode == 0, result.stdout + result.stderr
    assert (report / "count").read_text().strip() == "2"

    places = [(report / f"where-{n}").read_text().splitlines() for n in (1, 2)]
    assert all(lines[1] == "CI=true" for lines in places)
    clones = [Path(lines[0]) for lines in places]
    assert clones[0] != clones[1]
    assert all(clone.is_relative_to(tmp_path / "scratch") and clone != repo for clone in clones)
    assert not any(clone.exists() for clone in clones), "each clone is removed after its run"

    burners = {n: [int(pid) for pid in (report / f"burners-{n}").read_text().split()] for n in (1, 2)}
    survivors = [pid for pids in burners.values() for pid in pids if _alive(pid)]
    for pid in survivors:  # never leave a busy loop on CI's cores, even when the check fails
        os.kill(pid, signal.SIGKILL)
    assert [len(pids) for pids in burners.values()] == [2, 2], f"burners seen by runs 1 and 2: {burners}"
    assert not survivors, "a burner outlived the driver"

    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "2 run(s), 2 burner(s)" in summary
    assert summary.count("rc 0,") == 2 and summary.count("pytest: 42 passed in 0.10s") == 2
    assert summary.rstrip().endswith("2 of 2 run(s) passed")


def test_one_failed_run_fails_the_driver_and_the_rest_still_run(tmp_path: Path) -> None:
    repo = _stand_in_repo(tmp_path)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "fail-1").touch()
    result = _drive(repo, tmp_path, "2", "0")
    assert result.returncode == 1
    assert (tmp_path / "report" / "count").read_text().strip() == "2"
    assert (tmp_path / "report" / "burners-1").read_text().split() == []
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "run 1/2: commit" in summary and "rc 1," in summary and "pytest: 1 failed, 41 passed" in summary
    assert "run 2/2: commit" in summary and "rc 0," in summary
    assert summary.rstrip().endswith("1 of 2 run(s) passed")
