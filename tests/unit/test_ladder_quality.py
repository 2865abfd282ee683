"""A ladder's quality column without an engine: the baseline probes itself (the control), the
precision step is compared with the baseline's outputs, the steps that change neither precision
nor speculation run no probe, the table shows the column and ``ladders show --json`` the figures;
a profile that says no turns it off."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from app.bus import Bus
from app.cli.ladder_cmds import format_ladder_table
from app.config import RunConfig
from app.ladder.run import Ladder
from app.ladder.state import LadderState
from app.profiles import load_profile, load_profile_file, resolve_profile
from app.quality.config import QualityConfig
from app.quality.divergence import Agreement, KldStats
from app.quality.probe import QualityFigures, Reference
from app.recording import RunRecorder
from app.runner import RunResult
from app.store import RunStore
from tests.fakes.campaign import AVX512, on_known_host
from tests.fakes.ladder import FakeEngines, FakeLadderRunner, Script
from tests.fuzz.hostile import cli

SCRIPTS = {"baseline": Script(400, 1.2), "batching": Script(1600, 12.0), "FP8 KV": Script(1500, 12.0),
           "prefix": Script(2000, 13.0)}


@pytest.fixture(autouse=True)
def _known_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.ladder.run as run_mod

    on_known_host(monkeypatch, run_mod)
    FakeLadderRunner.calls = []
    ProbingRunner.probes = []


class ProbingRunner(FakeLadderRunner):
    """The ladder's fake runs, with a probe where the configuration asks one: the baseline is its
    own reference; the FP8 KV cache keeps 75% of its tokens."""

    probes: ClassVar[list[tuple[str, Reference | None]]] = []

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        result = super().run(cancel)
        quality = self.config.quality
        if quality is not None and quality.enabled:
            reference = self.kwargs.get("quality_reference")
            ProbingRunner.probes.append((self.config.name, reference))
            share, kld = (1.0, 0.0) if reference is None else (0.75, 0.02)
            result.quality = QualityFigures(
                measured=True, engine="vllm", model="m", prompts=1, output_tokens=4, wall_s=0.5,
                reference={"kind": "self"} if reference is None else reference.described(),
                agreement=Agreement(outputs=1, token_share=share, exact_match=0.0 if kld else 1.0, diverged=int(kld > 0)),
                kld=KldStats(positions=4, mean=kld, median=kld, p90=kld, p99=kld, max=kld, same_top=1.0, rms_dp=0.0,
                             tail_mass_mean=0.0, tail_mass_max=0.0, positions_with_tail=0),
                capture=[{"prompt": "p", "prompt_ids": [], "tokens": [1, 2, 3, 4], "top": [None] * 4}])
        return result


def _ladder(store: RunStore, config: RunConfig) -> LadderState:
    FakeLadderRunner.scripts = SCRIPTS
    bus = Bus()
    recorder = RunRecorder(bus, store)
    ladder = Ladder(config, bus, spec=load_profile_file(resolve_profile("cpu-ladder")).ladder, profile="cpu-ladder",
                    engines=FakeEngines(), recorder=recorder, runner_factory=ProbingRunner, hardware=AVX512,
                    discover_flags=False)
    try:
        return ladder.run()
    finally:
        recorder.close()


def test_the_precision_step_is_measured_against_the_baseline(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        state = _ladder(store, load_profile(resolve_profile("cpu-ladder")))
    assert [r.status for r in state.rows] == ["completed"] * 4
    names = [name for name, _ref in ProbingRunner.probes]
    assert len(names) == 2 and "baseline" in names[0] and "FP8 KV" in names[1]  # batching and prefix: no probe
    assert ProbingRunner.probes[0][1] is None
    handed = ProbingRunner.probes[1][1]
    assert handed is not None and handed.kind == "ladder baseline" and handed.run_id == state.rows[0].run_ids[0]
    assert handed.outputs[0].tokens == [1, 2, 3, 4] and handed.problem is None
    baseline, batching, fp8, prefix = state.rows
    assert baseline.quality is not None and baseline.quality["reference"] == {"kind": "self"}
    assert fp8.quality is not None and fp8.quality["agreement"]["token_share"] == 0.75
    assert "capture" not in fp8.quality and batching.quality is None and prefix.quality is None
    table = format_ladder_table(state)
    header, _rule, first, _second, third = table.splitlines()[:5]
    assert header.split()[-1] == "quality" and first.endswith("= ref") and third.endswith("75.0% KLD 0.02")
    assert "quality: tokens identical to step 1's before the first divergence" in table and "1.0 s in all" in table
    shown = json.loads(cli("ladders", "show", state.ladder_id, "--db", str(tmp_path / "runs.db"), "--json")
                       .check().out)
    assert shown["rows"][2]["quality"]["kld"]["mean"] == 0.02 and shown["rows"][1]["quality"] is None


def test_a_profile_that_says_no_runs_no_probe_and_the_table_has_no_column(tmp_path: Path) -> None:
    config = load_profile(resolve_profile("cpu-ladder"))
    with RunStore(tmp_path / "runs.db") as store:
        state = _ladder(store, config.model_copy(update={"quality": QualityConfig(enabled=False)}))
    assert ProbingRunner.probes == [] and all(r.quality is None for r in state.rows)
    assert "quality" not in format_ladder_table(state).splitlines()[0]


def test_a_profile_that_asks_probes_every_step(tmp_path: Path) -> None:
    config: Any = load_profile(resolve_profile("cpu-ladder"))
    with RunStore(tmp_path / "runs.db") as store:
        state = _ladder(store, config.model_copy(update={"quality": QualityConfig(prompts=2)}))
    assert len(ProbingRunner.probes) == 4 and all(r.quality is not None for r in state.rows)
    assert all(ref is not None and ref.kind == "ladder baseline" for _name, ref in ProbingRunner.probes[1:])
