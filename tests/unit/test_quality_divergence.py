"""The quality probe's figures against a hand-worked example (llama.cpp's KLD definition, the mass
beyond top-k lumped and counted), the [quality] table's bad input, and a probe that cannot measure
(one line; the speed run stands)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.bus import Bus
from app.config import RunConfig
from app.profiles import ProfileError, profile_from_toml, profile_to_toml
from app.quality.config import QualityConfig
from app.quality.divergence import agreement, kld_stats, score_position
from app.quality.probe import Output, ProbeError, Reference, run_probe
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

LN = math.log


def test_kl_and_agreement_match_a_hand_worked_example() -> None:
    # Position 1, top-2 each: the reference names tokens 1 and 2 (0.5, 0.3: 0.2 beyond its top-k),
    # the run names 1 and 3. Only token 1 is in both lists: kept are {1}, the rest lumps the others,
    # P(rest) = 0.5, Q(rest) = 0.6. KL = 0.5 ln(0.5/0.4) + 0.5 ln(0.5/0.6) = 0.0204110 (a lower bound).
    first = score_position({1: LN(0.5), 2: LN(0.3)}, {1: LN(0.4), 3: LN(0.35)}, scored_token=1)
    assert first.kld == pytest.approx(0.5 * LN(0.5 / 0.4) + 0.5 * LN(0.5 / 0.6))
    assert first.kld == pytest.approx(0.0204110, abs=1e-7)
    assert first.same_top and first.p_diff == pytest.approx(-0.1) and first.tail_mass == pytest.approx(0.5)
    # Position 2, the whole vocabulary of 3: KL = 0.7 ln(0.7/0.2) + 0.2 ln(0.2/0.7) = 0.5 ln 3.5 = 0.6263815,
    # exact (no tail); the tops differ; the scored token 1 fell from 0.7 to 0.2.
    second = score_position({1: LN(0.7), 2: LN(0.2), 3: LN(0.1)}, {1: LN(0.2), 2: LN(0.7), 3: LN(0.1)}, 1)
    assert second.kld == pytest.approx(0.6263815, abs=1e-7)
    assert not second.same_top and second.p_diff == pytest.approx(-0.5) and second.tail_mass == 0.0
    stats = kld_stats([first, second])
    assert stats is not None
    assert stats.mean == pytest.approx((0.0204110 + 0.6263815) / 2, abs=1e-7)
    assert stats.error == pytest.approx((0.6263815 - 0.0204110) / 2, abs=1e-7)  # sqrt(var / (n - 1)), n = 2
    assert stats.same_top == 0.5 and stats.same_top_error == pytest.approx(0.5)
    assert stats.rms_dp == pytest.approx(math.sqrt((0.01 + 0.25) / 2))
    assert (stats.positions_with_tail, stats.tail_mass_max, stats.exact) == (1, pytest.approx(0.5), False)
    # Outputs: the first diverges at token 2 (2 of its 4 kept), the second is exact, the third stops
    # early (2 of 3 kept): 6 of 9 reference tokens before the first divergence.
    agreed = agreement([[1, 2, 3, 4], [5, 6], [7, 8, 9]], [[1, 2, 9, 4], [5, 6], [7, 8]])
    assert agreed.token_share == pytest.approx(6 / 9) and agreed.exact_match == pytest.approx(1 / 3)
    assert (agreed.diverged, agreed.first_divergence_min, agreed.first_divergence_median) == (2, 2, 2.0)


def test_identical_distributions_are_kl_zero_and_a_missing_token_counts_as_zero() -> None:
    same = {4: LN(0.6), 5: LN(0.4)}
    position = score_position(same, dict(same), 4)
    assert (position.kld, position.same_top, position.p_diff, position.tail_mass) == (0.0, True, 0.0, 0.0)
    gone = score_position({4: LN(0.6), 5: LN(0.4)}, {5: LN(0.9), 6: LN(0.1)}, 4)
    assert gone.p_diff == pytest.approx(-0.6) and not gone.same_top
    assert kld_stats([]) is None
    with pytest.raises(ValueError):
        score_position({}, same, 4)
    with pytest.raises(ValueError):
        agreement([[1]], [])


def test_the_quality_table_round_trips_and_refuses_bad_input() -> None:
    config = profile_from_toml('[quality]\nprompts = 4\noutput_tokens = 8\ntop_logprobs = -1\nreference = "12"\n'
                               'tasks = ["demo_repeat"]\n')
    assert config.quality == QualityConfig(prompts=4, output_tokens=8, top_logprobs=-1, reference="12",
                                           tasks=["demo_repeat"])
    assert profile_from_toml(profile_to_toml(config)) == config
    assert RunConfig().quality is None
    assert QualityConfig().top_logprobs_for("tunebench:demo") == -1 and QualityConfig().top_logprobs_for("m") == 20
    for bad, words in (("prompts = 0", "prompts must be a count"), ('prompts = ""', "prompts must name a file"),
                       ("top_logprobs = 0", "top_logprobs must be at least 1"), ("output_tokens = 0", "output_tokens"),
                       ('reference = " "', "reference must be a run id"), ("topk = 3", "topk")):
        with pytest.raises(ProfileError, match=words):
            profile_from_toml(f"[quality]\n{bad}\n")
    with pytest.raises(ValidationError):
        QualityConfig(batch=0)


def test_a_reference_that_cannot_be_one_is_one_line_before_any_request() -> None:
    config = QualityConfig(prompts=2)
    unreachable = "http://127.0.0.1:9"  # nothing is sent: each case is refused first
    no_figures = Reference.of_figures(None, "run", run_id=7)
    with pytest.raises(ProbeError, match="^run 7 has no quality figures"):
        run_probe(config, "vllm", unreachable, {}, "m", no_figures)
    other = Reference(kind="run", run_id=3, model="other-model", outputs=[Output("p", [], [1], [None])])
    with pytest.raises(ProbeError, match="ran model other-model, this run m"):
        run_probe(config, "vllm", unreachable, {}, "m", other)
    with pytest.raises(ProbeError, match="logprobs from vllm and llamacpp only, not sglang"):
        run_probe(config, "sglang", unreachable, {}, "m", None)
    with pytest.raises(ProbeError, match="cannot be read"):
        run_probe(QualityConfig(prompts="/nonexistent/prompts.txt"), "vllm", unreachable, {}, "m", None)


def test_a_capture_survives_its_json() -> None:
    output = Output("p", [1, 2], [3, 4], [{3: -0.25, 5: -1.5}, None])
    assert Output.from_json(output.to_json()) == output


def test_an_engine_without_logprobs_is_one_line_and_the_speed_run_is_stored(tmp_path: Path) -> None:
    """A server that answers completions but gives no logprobs (the fake streams text only): the
    run completes with its speed figures, stored, and its quality says why in one line."""
    config = RunConfig(name="no logprobs", workload=WorkloadConfig(num_requests=3, input_len=LengthSpec(mean=16),
                                                                   output_len=LengthSpec(mean=8)),
                       load=LoadConfig(concurrency=1, warmup_requests=0), quality=QualityConfig(prompts=2))
    bus = Bus()
    with FakeOpenAIServer(FakeBehaviour()) as server, RunStore(tmp_path / "runs.db") as store:
        recorder = RunRecorder(bus, store)
        try:
            result = Runner(config, bus, endpoint=server.base_url, telemetry=False).run()
        finally:
            recorder.close()
        stored = store.get_run(recorder.run_id or 0)
    assert result.status == "completed" and stored.status == "completed" and stored.n_requests == 3
    assert result.quality is not None and not result.quality.measured
    assert result.quality.error == "the engine's reply to /v1/completions is not JSON"
    assert stored.quality is not None and stored.quality["error"] == result.quality.error
    assert any(note == f"quality not measured: {result.quality.error}" for note in result.notes)
