"""'% of limit' (app.planner.live): a level's measured rate against the ceiling at the batch its
engine ran, the flag for a rate above the physics, the live variant and the roofline point."""

from __future__ import annotations

import pytest

from app.config import RunConfig
from app.load.metrics import EngineDeltas, LevelSummary
from app.planner.live import (
    ABOVE_CEILING_TEXT,
    limit_figures,
    live_limit_figures,
    plan_for_run,
    roofline,
    running_batch,
)
from app.planner.plan import decode_ceiling, make_plan
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig

LLAMA_8B = "meta-llama/Meta-Llama-3-8B-Instruct"


def config(concurrency: int = 8) -> RunConfig:
    return RunConfig(engine=EngineConfig(model=LLAMA_8B, runtime=RuntimeConfig(kind="executable", executable="vllm")),
                     features=Features(weights_dtype="fp8"),
                     workload=WorkloadConfig(input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=16)),
                     load=LoadConfig(concurrency=concurrency))


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    return make_plan(config(), gpu="H100 SXM")


def level(tok_per_s: float, tokens_per_step: float | None, peak: int = 8) -> LevelSummary:
    return LevelSummary(requests=10, completed=10, duration_s=10.0, output_tok_per_s=tok_per_s,
                        peak_concurrency=peak, engine=EngineDeltas(engine_tokens_per_step_mean=tokens_per_step))


def test_level_percent_uses_the_engine_batch(plan) -> None:  # type: ignore[no-untyped-def]
    ceiling_4 = decode_ceiling(plan, 4.0)
    figures = limit_figures(plan, level(0.5 * ceiling_4, tokens_per_step=4.0))
    assert figures is not None
    assert figures.batch == 4.0 and figures.batch_source == "engine tokens per step"
    assert figures.ceiling_tok_per_s == pytest.approx(ceiling_4)
    assert figures.fraction == pytest.approx(0.5)
    assert figures.text() == "50% of limit" and figures.flag is None
    # The roofline point: achieved FLOP/s on the bandwidth slope's side of the ridge at a small batch.
    roof = roofline(plan)
    assert roof.peak_flop_per_s is not None
    assert figures.arithmetic_intensity_flop_per_byte < (roof.ridge_flop_per_byte or 0)
    assert figures.achieved_flop_per_s == pytest.approx(
        0.5 * roof.attainable_flop_per_s(figures.arithmetic_intensity_flop_per_byte), rel=1e-6)


def test_prefill_tokens_do_not_raise_the_batch_above_the_requests(plan) -> None:  # type: ignore[no-untyped-def]
    figures = limit_figures(plan, level(100.0, tokens_per_step=40.0, peak=8))
    assert figures is not None and figures.batch == 8.0
    assert "capped" in figures.batch_source


def test_above_the_ceiling_is_a_bug_not_a_percentage(plan) -> None:  # type: ignore[no-untyped-def]
    figures = limit_figures(plan, level(1.5 * decode_ceiling(plan, 1.0), tokens_per_step=1.0))
    assert figures is not None
    assert figures.fraction is None
    assert figures.flag is not None and "above the physical ceiling" in figures.flag
    assert figures.text() == ABOVE_CEILING_TEXT and "%" not in figures.text()
    assert figures.percent_text() == "bug"


def test_nothing_measured_gives_no_figure(plan) -> None:  # type: ignore[no-untyped-def]
    assert limit_figures(plan, level(0.0, tokens_per_step=4.0)) is None
    assert limit_figures(plan, level(100.0, tokens_per_step=None, peak=0)) is None
    assert running_batch(None, None) == (None, "")


def test_live_figures_from_telemetry(plan) -> None:  # type: ignore[no-untyped-def]
    latest = {("client", "output_tok_per_s"): 0.25 * decode_ceiling(plan, 2.0),
              ("engine", "tokens_per_step_mean"): 2.0, ("engine", "requests_running"): 3.0}
    figures = live_limit_figures(plan, latest)
    assert figures is not None and figures.batch == 2.0
    assert figures.text() == "25% of limit"
    # Without tokens per step the running requests stand for the batch.
    del latest[("engine", "tokens_per_step_mean")]
    figures = live_limit_figures(plan, latest)
    assert figures is not None and figures.batch == 3.0 and "requests in flight" in figures.batch_source


def test_measured_acceptance_raises_the_ceiling(plan) -> None:  # type: ignore[no-untyped-def]
    summary = level(100.0, tokens_per_step=1.0)
    plain = limit_figures(plan, summary)
    summary.engine.spec_mean_acceptance_length = 2.0
    spec = limit_figures(plan, summary)
    assert plain is not None and spec is not None
    assert spec.ceiling_tok_per_s == pytest.approx(2 * plain.ceiling_tok_per_s)


def test_plan_for_a_recorded_gpu_run() -> None:
    plan, why = plan_for_run(config(), {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]})
    assert plan is not None and why is None and plan.hardware.name == "H100 SXM"
    none, why = plan_for_run(config(), {"gpus": [{"name": "Some Card"}]})
    assert none is None and why is not None and "spec table" in why
    unknown = config().model_copy(update={"engine": EngineConfig(model="nobody/unknown-model",
                                                                    runtime=RuntimeConfig(kind="executable",
                                                                                          executable="vllm"))})
    none, why = plan_for_run(unknown, {"gpus": [{"name": "H100"}]})
    assert none is None and why is not None and why.startswith("no ceiling")


def test_cli_level_table_has_the_percent_of_limit(plan) -> None:  # type: ignore[no-untyped-def]
    from app.cli.run_cmds import format_table
    from app.runner import LevelResult, RunResult

    levels = [LevelResult(index=0, label="c=1", mode="closed", started_wall_s=1.0,
                          summary=level(0.42 * decode_ceiling(plan, 1.0), tokens_per_step=1.0, peak=1)),
              LevelResult(index=1, label="c=8", mode="closed", started_wall_s=2.0,
                          summary=level(2.0 * decode_ceiling(plan, 8.0), tokens_per_step=8.0, peak=8))]
    result = RunResult(run_id="r", name="n", config=config(), started_wall_s=1.0, levels=levels)
    table = format_table(result, plan)
    header = table.splitlines()[0]
    assert header.rstrip().endswith("% limit")
    rows = table.splitlines()[2:4]
    assert rows[0].rstrip().endswith("42%") and rows[1].rstrip().endswith("bug")
    assert "200%" not in table and "above the physical ceiling" in table
    assert "% limit" not in format_table(result)  # no plan, no column
