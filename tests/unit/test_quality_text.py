"""A run's quality in words (``app.quality.text``), the A/B split of two outputs
(``app.quality.outputs``), and the faces that carry them: the before/after cost line and a launch
script's header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.config import RunConfig
from app.cost.arithmetic import CostFigure
from app.cost.runs import RunCost
from app.cost.text import before_after_cost_text
from app.export.launch import LaunchSpec, render_launch
from app.quality.outputs import output_pair, side_by_side, token_ids_text
from app.quality.probe import Output, QualityFigures
from app.quality.text import quality_kept
from app.store import RunStore

FLOOR = {"agreement": {"outputs": 8, "token_share": 1.0, "exact_match": 1.0, "diverged": 0},
         "kld": {"positions": 128, "mean": 0.0004, "error": 0.0001, "median": 0.0, "p90": 0.001, "p99": 0.002,
                 "max": 0.003, "same_top": 1.0, "rms_dp": 0.001, "tail_mass_mean": 0.0, "tail_mass_max": 0.0,
                 "positions_with_tail": 0}}


def _figures(token_share: float, kld_mean: float, *, within: bool | None, tail: int = 0,
             accuracy: dict[str, Any] | None = None) -> dict[str, Any]:
    kld = {**FLOOR["kld"], "mean": kld_mean, "error": 0.0003, "positions_with_tail": tail}
    return {"measured": True, "reference": {"kind": "ladder baseline", "label": "step 1 (baseline)"},
            "agreement": {**FLOOR["agreement"], "token_share": token_share}, "kld": kld, "noise_floor": FLOOR,
            "within_noise": within, "accuracy": accuracy, "prompts": 8, "output_tokens": 16,
            "capture": [{"prompt": "p", "tokens": [1, 2]}]}


def test_beyond_the_noise_floor_the_loss_is_said_and_not_greyed() -> None:
    kept = quality_kept(_figures(0.996, 0.0123, within=False))
    assert kept is not None and kept.measured and not kept.greyed
    assert kept.text == "quality kept: 99.6% of tokens identical to step 1 (baseline), mean KLD 0.012 \u00b1 0.0003"
    assert kept.figure == "99.6%" and kept.short == "quality kept 99.6%"
    assert kept.detail == "KLD 0.012"


def test_within_the_noise_floor_it_is_greyed_and_says_so() -> None:
    kept = quality_kept(_figures(1.0, 0.0004, within=True))
    assert kept is not None and kept.greyed
    assert kept.text.endswith("; within the noise floor") and kept.detail.endswith("(within noise)")


def test_a_face_names_the_reference_its_own_way_and_a_tail_makes_kld_a_lower_bound() -> None:
    kept = quality_kept(_figures(0.5, 0.2, within=False, tail=3), reference_label="#12 fp16")
    assert kept is not None and "identical to #12 fp16, mean KLD 0.2+ \u00b1" in kept.text


def test_accuracy_beside_the_agreement_when_lm_eval_scored_it() -> None:
    accuracy = {"task": "demo_repeat", "metric": "exact_match", "value": 0.94, "stderr": 0.021,
                "reference_value": 0.95}
    kept = quality_kept(_figures(0.9, 0.01, within=False, accuracy=accuracy))
    assert kept is not None and kept.text.endswith(", demo_repeat accuracy 94.0% \u00b1 2.1% (reference 95.0%)")


def test_missing_figures_none_and_an_error_is_one_greyed_line() -> None:
    assert quality_kept(None) is None and quality_kept({}) is None
    failed = QualityFigures(error="the engine returned no logprobs for its tokens: it cannot be probed")
    kept = quality_kept(failed.shown())
    assert kept is not None and not kept.measured and kept.greyed and kept.short == ""
    assert kept.text == "quality not measured: the engine returned no logprobs for its tokens: it cannot be probed"
    assert kept.figure == "n/a"


def test_the_reference_itself_is_the_control_not_a_loss() -> None:
    control = {**_figures(1.0, 0.0, within=None), "reference": {"kind": "self"}}
    kept = quality_kept(control)
    assert kept is not None and kept.greyed and kept.figure == "= ref" and kept.short == ""
    assert kept.text == "quality: the reference itself (100.0% of tokens identical on a repeat)"
    noisy = quality_kept({**control, "kld": {**FLOOR["kld"], "mean": 0.0004}})
    assert noisy is not None and "noise floor mean KLD 0.0004" in noisy.text


def _cost(run_id: int, usd: float) -> RunCost:
    return RunCost(run_id=run_id, output=CostFigure(usd), total=CostFigure(usd / 2))


def test_the_money_line_carries_the_quality_kept_beside_the_price() -> None:
    line = before_after_cost_text("FP8 KV cache off \u2192 on", _cost(1, 1.84), _cost(2, 0.77), None, None,
                                  quality="quality kept 99.6%")
    assert line.endswith(", quality kept 99.6%")
    assert "$1.84 \u2192 $0.77 per 1M output tokens" in line
    assert "quality" not in before_after_cost_text("x", _cost(1, 1.0), _cost(2, 1.0), None, None)


def test_the_launch_header_names_the_quality_measured_and_masks_secrets() -> None:
    config = RunConfig(name="fp8 kv")
    figures = _figures(0.996, 0.0123, within=False)
    script = render_launch(LaunchSpec(config, "run 7", "0.11.0", quality=figures), "bash")
    assert ("# Quality measured for this configuration (8 prompts x 16 tokens): quality kept: 99.6% of tokens "
            "identical to step 1 (baseline), mean KLD 0.012") in script
    leaked = {"measured": False, "error": "HTTP 401: api_key=sk-verysecret123456 refused"}
    masked = render_launch(LaunchSpec(config, "run 8", "0.11.0", quality=leaked), "docker")
    assert "# Quality measured for this configuration: quality not measured: HTTP 401" in masked
    assert "sk-verysecret123456" not in masked
    assert "Quality measured" not in render_launch(LaunchSpec(config, "profile x.toml", "0.11.0"), "bash")


def _decode(ids: list[int]) -> str:
    words = {1: " fox", 2: " dog", 3: " lazy", 4: ".", 5: " cat"}
    return "".join(words[i] for i in ids)


def test_two_outputs_split_at_their_first_divergence() -> None:
    pair = output_pair("repeat: fox dog lazy =>", [1, 2, 3, 4], [1, 2, 5, 4], _decode)
    assert (pair.shared, pair.before_token, pair.before_rest) == (" fox dog", " lazy", ".")
    assert (pair.after_token, pair.after_rest, pair.diverged_at) == (" cat", ".", 2)
    same = output_pair("p", [1, 4], [1, 4], _decode)
    assert same.diverged_at is None and same.shared == " fox." and not same.before_token
    shorter = output_pair("p", [1, 2], [1], _decode)
    assert (shorter.before_token, shorter.after_token, shorter.diverged_at) == (" dog", "", 1)


def test_side_by_side_pairs_the_shared_prompts_or_says_why_not() -> None:
    def capture(outputs: list[tuple[str, list[int]]]) -> dict[str, Any]:
        return {"capture": [Output(p, [], t).to_json() for p, t in outputs]}

    before = capture([("a", [1, 2]), ("b", [3, 4])])
    after = capture([("b", [3, 5]), ("a", [1, 2]), ("c", [1])])
    pairs, note = side_by_side(before, after, {}, decode=_decode)
    assert [p.prompt for p in pairs] == ["a", "b"] and [p.diverged_at for p in pairs] == [None, 1]
    assert note.startswith("1 of 2 outputs identical")
    assert side_by_side(before, {"capture": []}, {}, "#1 a", "#2 b")[1].startswith("#2 b kept no outputs")
    assert "other prompts" in side_by_side(before, capture([("z", [1])]), {}, decode=_decode)[1]
    ids, note = side_by_side(before, after, {"engine": {"model": "/nowhere/model"}})
    assert ids[1].before_token == token_ids_text([4]) == "\u27e84\u27e9" and note.endswith("token ids shown")


def test_cli_compare_says_each_runs_quality_kept_and_puts_it_beside_the_price(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        ids = []
        for name in ("bf16", "q4_0", "no probe"):
            run_id = store.create_run(name=name, engine_kind="llamacpp", model="tunebench:demo", started_at=1.9e9,
                                      config={"name": name})
            store.finish_run(run_id, "completed")
            ids.append(run_id)
        store.update_run(ids[0], quality={**_figures(1.0, 0.0, within=None), "reference": {"kind": "self"}})
        store.update_run(ids[1], quality={**_figures(0.625, 0.31, within=False),
                                          "reference": {"kind": "run", "run_id": ids[0], "label": "bf16"}})
    assert main(["compare", *map(str, ids), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"  #{ids[0]} (base): quality: the reference itself (100.0% of tokens identical on a repeat)" in out
    assert f"  #{ids[1]}: quality kept: 62.5% of tokens identical to #{ids[0]} bf16, mean KLD 0.31 \u00b1 0.0003" in out
    assert f"  #{ids[2]}: no quality probe" in out
    header = next(line for line in out.splitlines() if line.startswith("RUN"))
    assert "QUALITY KEPT" in header
    row = next(line for line in out.splitlines() if line.startswith(f"#{ids[1]} ") and "n/a" in line)
    assert row.split()[3] == "62.5%"  # the cost table: n/a, n/a, then the quality kept
