"""A tune's quality term without an engine: run-level quality bounds in --slo (the per-request SLO
refuses them), the reference configuration searched first and the others compared with its
outputs, a configuration below a bound never picked and named, the pick speed alone would have
made said, and a space that changes precision without a quality bound said to pick blind."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.errors import UserError
from app.export.tune_report import pick_text
from app.load.metrics import LevelSummary
from app.profiles import load_profile, resolve_profile
from app.quality.bounds import changes_quality, quality_failures
from app.quality.config import QualityConfig
from app.quality.divergence import Agreement, KldStats
from app.quality.probe import QualityFigures, Reference
from app.runner import RunResult
from app.slo import SloError, parse_run_slo, parse_slo
from app.tuner.run import Tuner
from app.tuner.space import build_space
from app.tuner.state import TuneState
from tests.fakes.campaign import AVX512, on_known_host
from tests.fakes.tuner import FakeEngines, FakeTuneRunner

SPACE = {"knobs": {"kv_cache_dtype": ["auto", "fp8"], "max_num_seqs": [8]}, "load": {"concurrency": [2, 4]}}
AGREEMENT = {"auto": 1.0, "fp8": 0.6}
"""What the fake probe measures: the 8-bit cache agrees on 60% of the reference's tokens."""


@pytest.fixture(autouse=True)
def _known_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.tuner.run as run_mod

    on_known_host(monkeypatch, run_mod)
    FakeTuneRunner.reset()
    FakeQualityRunner.probes = []


def _figures(agreement: float, reference: Reference | None = None) -> QualityFigures:
    kld = 0.0 if agreement == 1.0 else 0.05
    return QualityFigures(measured=True, engine="vllm", model="m", prompts=1, output_tokens=1,
                          reference={"kind": "self"} if reference is None else reference.described(),
                          agreement=Agreement(outputs=1, token_share=agreement, exact_match=agreement,
                                              diverged=0 if agreement == 1.0 else 1),
                          kld=KldStats(positions=1, mean=kld, median=kld, p90=kld, p99=kld, max=kld, same_top=1.0,
                                       rms_dp=0.0, tail_mass_mean=0.0, tail_mass_max=0.0, positions_with_tail=0),
                          capture=[{"prompt": "p", "prompt_ids": [], "tokens": [1], "top": [None]}])


class FakeQualityRunner(FakeTuneRunner):
    """The tune's fake runs, an FP8 KV cache twice as fast, and a probe where the profile asks one:
    each probe logged with (kv dtype, concurrency, the reference it was handed)."""

    probes: ClassVar[list[tuple[str, int, Reference | None]]] = []

    def measure(self, run_id: str, t0: float, cancel: threading.Event | None) -> LevelSummary:
        summary = super().measure(run_id, t0, cancel)
        if self.config.features.kv_cache_dtype == "fp8":
            summary.output_tok_per_s = (summary.output_tok_per_s or 0.0) * 2
        return summary

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        result = super().run(cancel)
        if self.config.quality is not None and self.config.quality.enabled:  # as the runner reads it
            reference = self.kwargs.get("quality_reference")
            kv = self.config.features.kv_cache_dtype
            FakeQualityRunner.probes.append((kv, self.config.load.concurrency, reference))
            result.quality = _figures(AGREEMENT[kv], reference)
        return result


def _base(**quality: Any) -> RunConfig:
    config = load_profile(resolve_profile("cpu-demo"))
    return config.model_copy(update={"quality": QualityConfig(**quality)}) if quality else config


def _tune(slo: str, config: RunConfig | None = None) -> tuple[TuneState, Tuner]:
    config = config or _base()
    tuner = Tuner(config, Bus(), slo=slo, space=build_space(config, AVX512, SPACE), profile="cpu-demo",
                  engines=FakeEngines(), runner_factory=FakeQualityRunner, hardware=AVX512, discover_flags=False)
    return tuner.run(), tuner


def test_a_quality_bound_excludes_the_faster_configuration_and_says_so() -> None:
    state, _ = _tune("ttft_ms<=400,tpot_ms<=60,agreement>=0.99")
    auto, fp8 = state.candidates
    assert state.pick is not None and state.pick.knobs["kv_cache_dtype"] == "auto"
    assert fp8.quality_excluded == "agreement 0.6, bound >= 0.99" and auto.quality_excluded is None
    assert state.quality["excluded"] == [fp8.label] and state.quality["pick_without_quality"] == fp8.label
    assert state.quality["reference"] == auto.label and "blind" not in state.quality
    assert auto.quality is not None and auto.quality["agreement"]["token_share"] == 1.0
    assert fp8.quality is not None and "capture" not in fp8.quality
    # One probe per configuration, with its lowest load; the reference first, measured against
    # itself; the other handed the reference's outputs.
    assert [(kv, c) for kv, c, _ref in FakeQualityRunner.probes] == [("auto", 2), ("fp8", 2)]
    assert FakeQualityRunner.probes[0][2] is None
    handed = FakeQualityRunner.probes[1][2]
    assert handed is not None and handed.kind == "tune reference" and handed.label == auto.label
    assert handed.problem is None and handed.outputs[0].tokens == [1]
    assert all(t.status == "passed" for t in state.trials)  # speed is judged as before, quality apart
    text = pick_text(state)
    assert f"The quality bounds (agreement>=0.99) excluded: {fp8.label}." in text
    assert f"Speed alone would have picked {fp8.label}: the quality term changed the pick." in text
    assert f"Quality against {auto.label}: = ref." in text


def test_without_a_quality_bound_a_precision_space_picks_blind_and_says_so() -> None:
    state, tuner = _tune("ttft_ms<=400,tpot_ms<=60")
    assert state.pick is not None and state.pick.knobs["kv_cache_dtype"] == "fp8"  # the fastest
    assert "kv_cache_dtype" in state.quality["blind"] and "speed alone" in state.quality["blind"]
    assert state.quality["excluded"] == [] and "pick_without_quality" not in state.quality
    assert len(FakeQualityRunner.probes) == 2  # measured and shown, not bound
    assert tuner.run_slo.request_text == "ttft_ms<=400,tpot_ms<=60"
    assert "Blind to quality: the space changes kv_cache_dtype" in pick_text(state)


def test_the_profile_can_say_no_but_not_beside_a_quality_bound() -> None:
    state, _ = _tune("ttft_ms<=400,tpot_ms<=60", _base(enabled=False))
    assert FakeQualityRunner.probes == [] and "blind" in state.quality
    with pytest.raises(UserError, match=r"--slo bounds quality \(kld_mean<=0\.01\) but the profile turns"):
        _tune("ttft_ms<=400,kld_mean<=0.01", _base(enabled=False))
    with pytest.raises(UserError, match="at least one per-request bound"):
        _tune("agreement>=0.99")


def test_the_grammar_keeps_per_request_slos_per_request() -> None:
    assert parse_run_slo("ttft_ms<=500, agreement>=0.99,kld_mean<0.01,accuracy_drop<=1").quality == [
        ("agreement", ">=", 0.99), ("kld_mean", "<", 0.01), ("accuracy_drop", "<=", 1.0)]
    assert parse_run_slo("ttft_ms<=500,agreement>=0.99").requests == [("ttft_ms", "<=", 500.0)]
    for text, words in (("agreement>=0.99", "run-level quality bound"), ("ttft_ms>=5", "upper limit"),
                        ("kld<=1", "unknown")):
        with pytest.raises(SloError, match=words):
            parse_slo(text)
    with pytest.raises(SloError, match="unknown .*agreement"):
        parse_run_slo("agreemnt>=0.9")


def test_quality_bounds_read_the_stored_figures() -> None:
    figures = _figures(0.6).shown()
    assert quality_failures(figures, [("agreement", ">=", 0.5), ("kld_mean", "<=", 0.1)]) == []
    assert quality_failures(figures, [("kld_mean", "<=", 0.01)]) == ["kld_mean 0.05, bound <= 0.01"]
    assert quality_failures({**figures, "accuracy": {"value": 0.9, "reference_value": 0.95}},
                            [("accuracy_drop", "<=", 1)]) == ["accuracy_drop 5, bound <= 1"]
    assert quality_failures(figures, [("accuracy_drop", "<=", 1)]) == ["accuracy_drop not measured"]
    assert quality_failures({"measured": False, "error": "no logprobs"}, [("agreement", ">=", 0.9)]) == [
        "agreement not measured (no logprobs)"]
    assert changes_quality(["speculative.method"]) and changes_quality(["weights_dtype"])
    assert not changes_quality(["max_num_seqs", "prefix_caching"])
