"""The HTML report's roofline: one chart per planned run, one point per level, the hardware's roof,
and a level above its ceiling drawn as a bug (app.export.report with app.planner.live)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from app.analysis.compare import single_run_comparison
from app.config import RunConfig
from app.export import render_report
from app.load.metrics import EngineDeltas, LevelSummary
from app.planner.plan import decode_ceiling, make_plan
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig

LLAMA_8B = "meta-llama/Meta-Llama-3-8B-Instruct"


def _config() -> RunConfig:
    return RunConfig(name="roof", engine=EngineConfig(model=LLAMA_8B, runtime=RuntimeConfig(kind="executable",
                                                                                           executable="vllm")),
                     features=Features(weights_dtype="fp8"),
                     workload=WorkloadConfig(input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=16)),
                     load=LoadConfig(concurrency=8))


def _svgs(html: str) -> list[str]:
    return [base64.b64decode(i).decode() for i in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)]


def test_report_draws_a_roofline_point_per_level(tmp_path: Path) -> None:
    config = _config()
    plan = make_plan(config, gpu="H100 SXM")
    # Three levels: two under their ceiling, one above it (a bug in plan or measurement).
    levels = [(1.0, 0.4 * decode_ceiling(plan, 1.0)), (4.0, 0.6 * decode_ceiling(plan, 4.0)),
              (8.0, 1.5 * decode_ceiling(plan, 8.0))]
    with RunStore(tmp_path / "r.db") as store:
        run_id = store.create_run(name="roof", engine_kind="vllm", model=LLAMA_8B,
                                  config=config.model_dump(mode="json"), started_at=1.9e9,
                                  hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
        for i, (batch, rate) in enumerate(levels):
            store.start_level(run_id, i, f"c={int(batch)}", started_at=1.9e9 + 10 * i)
            summary = LevelSummary(requests=10, completed=10, duration_s=10.0, output_tok_per_s=rate,
                                   peak_concurrency=int(batch),
                                   engine=EngineDeltas(engine_tokens_per_step_mean=batch))
            store.finish_level(run_id, i, summary.model_dump(mode="json"), 1.9e9 + 10 * i + 9)
        store.finish_run(run_id, "completed", None, {})
        html = render_report(single_run_comparison(store, run_id))
    assert "<h2>Roofline</h2>" in html
    roofs = [s for s in _svgs(html) if "Roofline" in s]
    assert len(roofs) == 1
    svg = roofs[0]
    assert len(re.findall(r'<circle class="level"', svg)) == len(levels)
    assert 'class="roof"' in svg and "H100 SXM x1" in svg and "arithmetic intensity" in svg
    assert "40% of limit" in svg and "60% of limit" in svg
    assert "above the ceiling: a bug" in svg and "150%" not in svg
    assert "above the physical ceiling" in html  # the note says why, beside the chart


def test_no_plan_says_why_instead_of_a_chart(tmp_path: Path) -> None:
    config = _config().model_copy(update={"engine": EngineConfig(model="nobody/unknown",
                                                                   runtime=RuntimeConfig(kind="executable",
                                                                                         executable="vllm"))})
    with RunStore(tmp_path / "r.db") as store:
        run_id = store.create_run(name="x", config=config.model_dump(mode="json"), started_at=1.9e9,
                                  hardware={"gpus": [{"index": 0, "name": "H100"}]})
        store.start_level(run_id, 0, "c=1", started_at=1.9e9)
        store.finish_level(run_id, 0, LevelSummary(requests=1, completed=1, duration_s=1.0,
                                                   output_tok_per_s=10.0).model_dump(mode="json"), 1.9e9 + 1)
        store.finish_run(run_id, "completed", None, {})
        html = render_report(single_run_comparison(store, run_id))
    assert not [s for s in _svgs(html) if "Roofline" in s]
    assert "no ceiling" in html


@pytest.mark.parametrize("n", [1, 5])
def test_roofline_svg_is_well_formed(n: int) -> None:
    from xml.etree import ElementTree

    from app.export.report import roofline_svg
    from app.planner.live import limit_at, roofline

    plan = make_plan(_config(), gpu="H100 SXM")
    points = [(f"<lvl {i}>", f) for i in range(n)
              if (f := limit_at(plan, 0.5 * decode_ceiling(plan, 2.0**i), 2.0**i, batch_source="test")) is not None]
    root = ElementTree.fromstring(roofline_svg("Roofline & co", roofline(plan), points))
    assert len([c for c in root.iter("{http://www.w3.org/2000/svg}circle")]) == n
