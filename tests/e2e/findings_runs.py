"""Runs on a real engine for the findings' end-to-end tests: each recorded as the recorder stores
it, then explained from the store as ``tunebench explain`` reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.analysis.findings import Finding, explain, load_run
from app.cli import main
from app.config import RunConfig
from app.planner.stored import level_limits
from app.store import RunStore
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.launcher import EngineProcess
from tests.stored_runs import record_run

HEALTHY_ATTEMPTS = 3


def record(engine: EngineProcess, store: RunStore, workload: WorkloadConfig, load: LoadConfig, name: str,
           config: RunConfig | None = None) -> int:
    """One run on ``engine`` with telemetry, stored as the recorder stores it; its id."""
    config = config or RunConfig(name=name, engine=engine.engine, features=engine.features, workload=workload,
                                 load=load)
    return record_run([store], engine, config, telemetry=True)[0]


def explained(store: RunStore, run_id: int, against: int | None = None) -> list[Finding]:
    findings = explain(load_run(store, run_id, level_limits),
                       load_run(store, against, level_limits) if against is not None else None)
    print(f"\nrun {run_id}" + (f" against {against}" if against is not None else "") + ":\n"
          + "\n".join(f"  [{f.severity}] {f.rule}: {'; '.join(e.text() for e in f.evidence)}" for f in findings))
    return findings


def one(findings: list[Finding], rule: str) -> Finding:
    found = [f for f in findings if f.rule == rule]
    assert len(found) == 1, f"{rule} not found once in {[f.rule for f in findings]}"
    return found[0]


def evidence(finding: Finding, figure: str) -> float:
    values = [e.value for e in finding.evidence if e.figure == figure]
    assert values, f"{finding.rule} has no {figure!r}: {[e.figure for e in finding.evidence]}"
    return max(values)


def warnings_of(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings if f.severity == "warning"]


def healthy_run(engine: EngineProcess, store: RunStore, workload: WorkloadConfig, load: LoadConfig) -> int:
    """A healthy run's id, or the last of HEALTHY_ATTEMPTS runs: another program on this shared
    machine may starve the client now and then, which ``client_limited`` rightly says (its own loop
    lag shows it). No run may raise any other warning: that would be a false alarm."""
    for _ in range(HEALTHY_ATTEMPTS):
        run_id = record(engine, store, workload, load, name="healthy")
        findings = explained(store, run_id)
        warnings = warnings_of(findings)
        if not warnings:
            return run_id
        assert warnings == ["client_limited"], warnings  # any other warning is a false alarm
        client = one(findings, "client_limited")
        assert "starved" in client.explanation and evidence(client, "client loop lag p99") > 5.0, client
    return run_id


def explain_says_it(db: Path, run_id: int, capsys: pytest.CaptureFixture[str]) -> None:
    """``tunebench explain``: a run without a warning in one line under its title; a run whose
    client was starved, that warning alone."""
    capsys.readouterr()
    assert main(["explain", str(run_id), "--db", str(db)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    warned = [line for line in out if line.startswith("[warning]")]
    print("\n".join(out[:2] + warned))
    if warned:
        assert [line.split()[1] for line in warned] == ["client_limited"], out
    else:
        assert out[1].startswith(f"no warning: run {run_id} is healthy"), out
