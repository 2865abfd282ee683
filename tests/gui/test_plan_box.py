"""The plan beside the toggles (app.gui.plan_box) and "% of limit" in the live dashboard: FP8 KV
doubles the sequences that fit before anything is launched, an unknown model is one grey line,
and fed telemetry gives the tile, the dashed ceiling and the roofline point."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from app.bus import Bus  # noqa: E402
from app.config import RunConfig  # noqa: E402
from app.events import LevelFinished  # noqa: E402
from app.gui.config_panel import ConfigState  # noqa: E402
from app.gui.plan_box import PlanBox  # noqa: E402
from app.gui.workers import busy_workers  # noqa: E402
from app.load.metrics import EngineDeltas, LevelSummary  # noqa: E402
from app.planner.plan import Hardware, Plan, decode_ceiling, make_plan  # noqa: E402
from app.profiles import load_profile, resolve_profile  # noqa: E402
from engine_adapters.gpu_specs import GIB  # noqa: E402

CPU = Hardware(kind="cpu", name="test CPU", memory_bytes=64 * GIB, bandwidth_bytes_per_s=20e9, source="test")


def fixed_planner(config: RunConfig, gpu: str | None) -> Plan:
    """The real planner on a fixed host (no bandwidth measurement in a test)."""
    return make_plan(config, gpu=gpu, hardware=None if gpu else CPU)


@pytest.fixture
def box(qtbot):  # type: ignore[no-untyped-def]
    state = ConfigState(load_profile(resolve_profile("cpu-demo")))
    widget = PlanBox(state, planner=fixed_planner)
    qtbot.addWidget(widget)
    widget.show()
    yield widget
    qtbot.waitUntil(lambda: not busy_workers(), timeout=10_000)


def test_fp8_kv_doubles_the_sequences_that_fit(qtbot, box: PlanBox) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(lambda: box.plan is not None and box.pending == 0, timeout=20_000)
    assert box.plan is not None and box.plan.kv_dtype == "bf16"
    before = box.plan.memory.max_concurrent_seqs
    assert f"{before:,} at" in box.values["seqs"].text()
    assert "tok/s at batch 1" in box.values["ceiling"].text()
    assert box.state.set("features.kv_cache_dtype", "fp8") is None
    qtbot.waitUntil(lambda: box.plan is not None and box.plan.kv_dtype == "fp8" and box.pending == 0, timeout=20_000)
    after = box.plan.memory.max_concurrent_seqs
    assert after == 2 * before
    assert f"{after:,} at" in box.values["seqs"].text()
    assert "FP8" in box.values["kv"].text()


def test_an_unknown_model_is_a_grey_line_and_a_card_can_be_chosen(qtbot, box: PlanBox) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(lambda: box.plan is not None and box.pending == 0, timeout=20_000)
    assert box.state.set("engine.model", "nobody/unknown-model") is None
    qtbot.waitUntil(lambda: box.error is not None and box.pending == 0, timeout=20_000)
    assert box.plan is None and box.values["seqs"].text() == "–"
    text = box.status.text()
    assert text.startswith("No plan: no architecture for model 'nobody/unknown-model'") and len(text) < 120
    assert "\n" not in text
    # A card from the spec table: the curated Llama-3-8B planned for an H100 (nothing local needed).
    box.state.set("engine.model", "meta-llama/Meta-Llama-3-8B-Instruct")
    box.gpu.setCurrentText("H100 SXM")
    qtbot.waitUntil(lambda: box.plan is not None and box.plan.hardware.name == "H100 SXM" and box.pending == 0,
                    timeout=20_000)
    assert "GB" in box.values["weights"].text() and "H100 SXM" in box.status.text()


def test_the_limit_tile_ceiling_and_roofline_follow_fed_telemetry(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    plan = fixed_planner(window.state.config, None)
    window.set_run_plan(plan)
    ceiling = decode_ceiling(plan, 2.0)
    bus: Bus = window.bus
    for i in range(5):
        bus.sample("engine", {"tokens_per_step_mean": 2.0, "requests_running": 2.0, "generation_tok_per_s": 0.3 * ceiling})
        bus.sample("client", {"output_tok_per_s": 0.3 * ceiling, "requests_in_flight": 2.0, "requests_done": float(i)})
    tile = window.dashboard.tiles.limit_tile
    qtbot.waitUntil(lambda: tile.text() == "30%", timeout=10_000)
    assert "batch 2.0" in tile.sub.text()
    tokens = window.dashboard.plots.panels["tokens"]
    qtbot.waitUntil(lambda: tokens.ceiling is not None, timeout=10_000)
    assert tokens.ceiling == pytest.approx(ceiling, rel=1e-2)
    assert window.dashboard.roofline.live is not None
    # A rate above the physics: the tile says so, never "150%".
    bus.sample("client", {"output_tok_per_s": 1.5 * ceiling})
    qtbot.waitUntil(lambda: tile.text() == "bug", timeout=10_000)
    assert "above the ceiling" in tile.caption.text()
    # A finished level: a point on the roofline.
    summary = LevelSummary(requests=10, completed=10, duration_s=10.0, output_tok_per_s=0.3 * ceiling,
                           peak_concurrency=2, engine=EngineDeltas(engine_tokens_per_step_mean=2.0))
    bus.emit(LevelFinished(run_id="r", index=0, label="c=2", summary=summary))
    qtbot.waitUntil(lambda: len(window.dashboard.roofline.points()) == 1, timeout=10_000)
