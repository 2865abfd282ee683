"""Cost and capacity from measured runs (``app.cost``, ``tunebench capacity``): the arithmetic
pinned to hand-computed cases (TP=4, DP=2, a CPU run), the extrapolation note, an unreachable
SLO, and every bad input as one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cost import (
    CostFigure,
    default_prices,
    parse_price,
    plan_capacity,
    price_table,
    run_deployment,
    usd_per_million_tokens,
)
from app.cost.arithmetic import (
    good_output_tok_per_s,
    nodes_for,
    replicas_for_tokens_per_day,
    replicas_for_users,
    running_cost,
)
from app.errors import UserError
from app.load.metrics import LevelSummary, Stats
from app.store import RunStore
from db.records import ImportedRun, LevelInfo, RunDetail
from tests.fuzz.hostile import Outcome, cli
from tests.stored_runs import store_measured_run

GPU_ENGINE = {"model": "meta-llama/Llama-3.1-70B-Instruct", "runtime": {"kind": "executable", "executable": "vllm"}}
DEFAULT = "default price, as of 2026-12"


# --- pure arithmetic ------------------------------------------------------------------------------

def test_cost_per_million_tokens_is_gpus_times_price_over_tokens_per_hour() -> None:
    # 4 GPUs x 2.49 $/h = 9.96 $/h; 1,440 tok/s = 5,184,000 tok/h -> 9.96 / 5.184 = 1.92130 $ per 1M.
    assert usd_per_million_tokens(4, 2.49, 1440.0).usd == pytest.approx(1.9212963, rel=1e-7)
    # 7 cores x 0.05 $/h = 0.35 $/h; 20 tok/s = 72,000 tok/h -> 4.86111 $ per 1M.
    assert usd_per_million_tokens(7, 0.05, 20.0).usd == pytest.approx(4.8611111, rel=1e-7)


@pytest.mark.parametrize(("tok_per_s", "reason"), [(None, "no throughput"), (math.nan, "no throughput"),
                                                   (0.0, "zero"), (-3.0, "zero")])
def test_a_cost_without_throughput_is_none_with_a_reason(tok_per_s: float | None, reason: str) -> None:
    figure = usd_per_million_tokens(4, 2.49, tok_per_s)
    assert figure.usd is None and figure.reason is not None and reason in figure.reason


def test_good_output_rate_is_goodput_times_mean_output_tokens() -> None:
    # 12.96 good req/s; 1,440 tok/s over 14.4 completed req/s = 100 tokens a request -> 1,296 tok/s.
    assert good_output_tok_per_s(12.96, 1440.0, 14.4) == pytest.approx(1296.0)
    assert good_output_tok_per_s(None, 1440.0, 14.4) is None
    assert good_output_tok_per_s(12.96, 1440.0, 0.0) is None


def test_replicas_round_up_without_float_noise() -> None:
    assert replicas_for_users(100, 10.0, 0.3) == 13
    assert replicas_for_users(50, 1.0, 0.1) == 55  # 50 x 1.1 = 55.00000000000001 in floats
    assert replicas_for_users(1000, 16.0, 0.3) == 82  # 1,300 / 16 = 81.25
    assert replicas_for_users(16, 16.0, 0.0) == 1
    assert replicas_for_users(17, 16.0, 0.0) == 2
    # 1e9 tokens a day = 11,574.07 tok/s; x 1.3 / 1,440 per replica = 10.45 -> 11.
    assert replicas_for_tokens_per_day(1e9, 1440.0, 0.3) == 11
    assert nodes_for(328, 8) == 41 and nodes_for(9, 8) == 2 and nodes_for(4, None) is None


def test_running_cost_per_day_and_30_day_month() -> None:
    cost = running_cost(328, 2.49)
    assert cost.unit_hours_per_day == 7872
    assert cost.usd_per_day == pytest.approx(19_601.28)
    assert cost.usd_per_month == pytest.approx(588_038.40)


@pytest.mark.parametrize("users", [0, -5])
def test_zero_or_negative_users_are_refused(users: int) -> None:
    with pytest.raises(UserError, match="at least 1"):
        replicas_for_users(users, 16.0, 0.3)


# --- prices ---------------------------------------------------------------------------------------

def test_the_shipped_prices_are_dated_list_prices() -> None:
    table = default_prices()
    assert table.as_of == "2026-12" and "not quotes" in table.source
    assert table.gpu_hour_usd["H100"] == 2.49 and table.cpu_core_hour_usd == 0.05
    text = (Path(__file__).parents[2] / "assets" / "prices.toml").read_text()
    assert "TYPICAL LIST PRICES TO BE OVERRIDDEN" in text


@pytest.mark.parametrize(("gpu_name", "key"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA B200", "B200"),
])
def test_gpu_names_find_their_default_price(gpu_name: str, key: str) -> None:
    price = default_prices().gpu(gpu_name)
    assert price.key == key and not price.yours and price.source == DEFAULT


def test_your_price_wins_and_says_so() -> None:
    table = price_table(["H100=2.00", "cpu=0.02"])
    price = table.gpu("NVIDIA H100 80GB HBM3")
    assert (price.usd_per_hour, price.yours, price.source) == (2.0, True, "your price")
    assert table.cpu().usd_per_hour == 0.02 and table.cpu().yours
    # A spec-table name matches the NVML name of the same card (engine_adapters.gpu_specs).
    assert price_table(["H100 SXM=3.1"]).gpu("NVIDIA H100 80GB HBM3").usd_per_hour == 3.1


def test_a_gpu_with_no_price_says_which_and_how_to_pass_one() -> None:
    with pytest.raises(UserError) as info:
        default_prices().gpu("NVIDIA GeForce RTX 4090")
    message = str(info.value)
    assert "NVIDIA GeForce RTX 4090" in message and "--price 'NAME=USD_PER_HOUR'" in message
    with pytest.raises(UserError):
        default_prices().gpu("NVIDIA GH200 480GB")  # not priced as an H200


@pytest.mark.parametrize(("text", "message"), [
    ("H100", "expected NAME=USD_PER_HOUR"), ("=2.49", "name before '=' is empty"),
    ("H100=-1", "must be above 0"), ("H100=0", "must be above 0"), ("H100=abc", "is not a number"),
    ("H100=", "is not a number"), ("H100=nan", "finite"), ("H100=inf", "finite"), ("H100=1e9", "a typo"),
])
def test_bad_prices_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_price(text)


def test_a_good_price_parses() -> None:
    assert parse_price(" H100 = 2.49 ") == ("H100", 2.49)
    assert parse_price("A100 80GB=1.5") == ("A100 80GB", 1.5)


# --- what a run used ------------------------------------------------------------------------------

def _detail(config: dict[str, Any], **values: Any) -> RunDetail:
    return RunDetail(id=7, uid="u7", name="r", status="completed", started_at=1.9e9, config=config, **values)


def test_gpus_per_replica_are_tp_times_pp_and_dp_counts_replicas() -> None:
    config = {"engine": GPU_ENGINE, "features": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2,
                                                 "data_parallel_size": 2}}
    d = run_deployment(_detail(config, hardware={"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 8}))
    assert (d.kind, d.units_per_replica, d.data_parallel, d.units_measured, d.units_per_node) == ("gpu", 4, 2, 8, 8)


def test_cpu_cores_are_the_bound_ones_else_the_whole_machine() -> None:
    bound = run_deployment(_detail({"name": "cpu"}, env={"VLLM_CPU_OMP_THREADS_BIND": "0-5,7"},
                                   hardware={"cpu_count_logical": 16, "cpu_model": "Xeon"}))
    assert (bound.kind, bound.units_per_replica, bound.device) == ("cpu", 7, "Xeon")
    assert bound.counted == "the cores the engine's threads were bound to, VLLM_CPU_OMP_THREADS_BIND=0-5,7"
    unbound = run_deployment(_detail({"name": "cpu"}, env={"VLLM_CPU_OMP_THREADS_BIND": "auto"}, hardware={"cpu_count_logical": 16}))
    assert unbound.units_per_replica == 16 and "not bound" in unbound.counted


def test_a_gpu_run_without_a_recorded_gpu_needs_gpu() -> None:
    run = _detail({"engine": GPU_ENGINE})
    with pytest.raises(UserError, match="--gpu NAME"):
        run_deployment(run)
    assert run_deployment(run, gpu="H100").device == "H100"


# --- a store of measured runs ---------------------------------------------------------------------

def _summary(tok_per_s: float, ttft_p99_ms: float, slo: str | None = None) -> dict[str, Any]:
    """A level of 100 completed requests of 100 output and 50 input tokens over 10 s; 90% of them
    met ``slo`` when one was set."""
    rps = tok_per_s / 100
    summary = LevelSummary(requests=100, completed=100, duration_s=10.0, output_tok_per_s=tok_per_s,
                           total_tok_per_s=tok_per_s * 1.5, request_throughput_rps=rps,
                           ttft_ms=Stats(count=100, mean=ttft_p99_ms / 2, median=ttft_p99_ms / 2, p99=ttft_p99_ms))
    if slo:
        summary.slo, summary.good_requests, summary.goodput_rps = slo, 90, rps * 0.9
    return summary.model_dump(mode="json")


def _store_run(store: RunStore, name: str, config: dict[str, Any], levels: list[tuple[int, float, float]], *,
               hardware: dict[str, Any], env: dict[str, str] | None = None) -> int:
    slo = config.get("load", {}).get("slo")
    return store_measured_run(store, name, config, [(concurrency, _summary(tok_per_s, ttft_p99_ms, slo))
                                                    for concurrency, tok_per_s, ttft_p99_ms in levels],
                              hardware=hardware, env=env, level_s=10.0)


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "capacity.db"
    with RunStore(path) as store:
        _store_run(store, "tp4 sweep", {"engine": GPU_ENGINE, "features": {"tensor_parallel_size": 4},
                                        "load": {"pattern": "sweep", "levels": [8, 16, 32], "slo": "ttft_ms<=500"}},
                   [(8, 800.0, 200.0), (16, 1440.0, 400.0), (32, 2000.0, 900.0)],
                   hardware={"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]})
        _store_run(store, "dp2", {"engine": GPU_ENGINE, "features": {"data_parallel_size": 2}},
                   [(4, 600.0, 150.0), (8, 1000.0, 300.0)],
                   hardware={"gpus": [{"index": i, "name": "NVIDIA H200"} for i in range(2)]})
        _store_run(store, "cpu demo", {}, [(2, 20.0, 300.0)], env={"VLLM_CPU_OMP_THREADS_BIND": "0-6"},
                   hardware={"cpu_model": "Xeon", "cpu_count_logical": 8})
        _store_run(store, "rtx", {"engine": GPU_ENGINE}, [(4, 100.0, 100.0)],
                   hardware={"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090"}]})
        store.import_runs([ImportedRun(name="bench", imported_from="vllm bench serve: x.json", started_at=1.9e9,
                                       finished_at=1.9e9 + 10, config={"imported": {"tool": "vllm bench serve"}},
                                       levels=[LevelInfo(idx=0, summary=_summary(100.0, 100.0))])])
    return path


def capacity(db: Path, *argv: str) -> Outcome:
    return cli("capacity", "--db", str(db), *argv).check()


def test_tp4_run_four_gpus_per_replica(db: Path) -> None:
    out = capacity(db, "tp4 sweep", "--slo", "ttft_ms<=500", "--users", "1000")
    assert out.code == 0, out
    text = out.out
    # Level 2 misses (900 ms > 500); level 1 (16 in flight) is the highest that meets it.
    assert "sized on level 1 (concurrency 16)" in text
    assert "replica: 4 GPUs of NVIDIA H100 80GB HBM3 (TP 4 x PP 1 = 4 GPUs per replica)" in text
    assert "price: 2.49 $/GPU-h (default price, as of 2026-12)" in text
    assert "for 1,000 concurrent users with 30% headroom: 82 replicas" in text  # 1,300 / 16 = 81.25
    assert "answer: 82 replicas = 328 GPUs on 41 nodes of 8 GPUs" in text
    assert f"running ({DEFAULT}): 7,872 GPU-hours a day = $19,601.28 a day, $588,038.40 a month (30 days)" in text
    # 4 x 2.49 / (1,440 x 3600) x 1e6 = 1.92; total 2,160 tok/s: 1.28; good 1,296 tok/s: 2.13.
    assert "output $1.92; total $1.28; good output (your SLO): $2.13" in text
    assert "extrapolation from concurrency 16 (level 1, concurrency 16)" in text


def test_tp4_json_has_the_same_figures(db: Path) -> None:
    out = capacity(db, "1", "--slo", "ttft_ms<=500", "--users", "1000", "--json")
    data = json.loads(out.out)
    assert (data["replicas"], data["units"], data["nodes"], data["users_per_replica"]) == (82, 328, 41, 16.0)
    assert data["sized_on"]["idx"] == 1 and data["reachable"] and data["extrapolated"]
    assert data["usd_per_million_output"]["usd"] == pytest.approx(9.96 / (1440 * 3600) * 1e6)
    assert data["usd_per_million_output"]["price_source"] == DEFAULT
    assert data["running"]["usd_per_month"] == pytest.approx(588_038.40)
    assert [lv["meets_slo"] for lv in data["levels"]] == [True, True, False]


def test_within_the_measured_concurrency_there_is_no_extrapolation(db: Path) -> None:
    data = json.loads(capacity(db, "1", "--slo", "ttft_ms<=500", "--users", "10", "--json").out)
    assert data["replicas"] == 1 and data["units"] == 4 and not data["extrapolated"]  # 13 / 16 -> 1
    assert not any("extrapolation" in n for n in data["notes"])


def test_dp2_counts_users_per_replica_as_concurrency_over_dp(db: Path) -> None:
    out = capacity(db, "dp2", "--slo", "ttft_ms<=500", "--users", "10", "--headroom", "0",
                   "--tokens-per-day", str(86_400 * 1000), "--json")
    data = json.loads(out.out)
    assert data["deployment"]["data_parallel"] == 2 and data["deployment"]["units_per_replica"] == 1
    assert data["users_per_replica"] == 4.0  # level 1: 8 in flight over 2 replicas
    assert data["replicas_for_users"] == 3  # 10 / 4 = 2.5
    assert data["output_tok_per_s_per_replica"] == 500.0 and data["replicas_for_tokens"] == 2  # 1,000 / 500
    assert data["replicas"] == 3 and data["units"] == 3
    # Both replicas' throughput on both GPUs: 2 x 3.50 / (1,000 x 3600) x 1e6 = 1.944.
    assert data["usd_per_million_output"]["usd"] == pytest.approx(7.0 / 3.6e6 * 1e6)
    assert data["usd_per_million_good_output"]["usd"] is None  # the run set no SLO: no goodput
    assert "without an SLO" in data["usd_per_million_good_output"]["reason"]


def test_cpu_run_is_priced_per_bound_core(db: Path) -> None:
    out = capacity(db, "cpu demo", "--slo", "ttft_ms<=500", "--users", "10")
    text = out.out
    assert "replica: 7 cores of Xeon (the cores the engine's threads were bound to, VLLM_CPU_OMP_THREADS_BIND=0-6)" in text
    assert "price: 0.05 $/core-h (default price, as of 2026-12)" in text
    assert "answer: 7 replicas = 49 cores" in text and "nodes" not in text  # 13 / 2 = 6.5
    assert "1,176 core-hours a day = $58.80 a day, $1,764.00 a month" in text
    assert "output $4.86" in text  # 7 x 0.05 / (20 x 3600) x 1e6
    mine = json.loads(capacity(db, "cpu demo", "--slo", "ttft_ms<=500", "--users", "10", "--price", "cpu=0.10",
                               "--json").out)
    assert mine["price"]["source"] == "your price" and mine["usd_per_million_output"]["usd"] == pytest.approx(9.7222222)


def test_an_slo_no_level_met_is_not_a_number(db: Path) -> None:
    out = capacity(db, "1", "--slo", "ttft_ms<=100", "--users", "1000")
    assert ("not reachable with this configuration (best level: concurrency 8 at TTFT p99 200.0 ms "
            "(limit <= 100 ms))") in out.out
    assert "replicas" not in out.out and "$" not in out.out
    data = json.loads(capacity(db, "1", "--slo", "ttft_ms<=100", "--users", "1000", "--json").out)
    assert not data["reachable"] and data["replicas"] is None and data["usd_per_million_output"] is None


def test_an_unpriced_gpu_is_priced_with_yours(db: Path) -> None:
    out = cli("capacity", "--db", str(db), "rtx", "--slo", "ttft_ms<=500", "--users", "4").check()
    assert out.code == 2 and "no price for the GPU 'NVIDIA GeForce RTX 4090'" in out.err
    assert "--price 'NAME=USD_PER_HOUR'" in out.err
    priced = capacity(db, "rtx", "--slo", "ttft_ms<=500", "--users", "4", "--price", "RTX 4090=0.70")
    assert priced.code == 0 and "price: 0.70 $/GPU-h (your price)" in priced.out


@pytest.mark.parametrize(("argv", "message"), [
    (["--price", "H100=-1"], "must be above 0"),
    (["--price", "H100=abc"], "is not a number"),
    (["--price", "H100=nan"], "finite"),
    (["--price", "H100"], "expected NAME=USD_PER_HOUR"),
    (["--users", "0"], "expected a whole number from 1"),
    (["--users", "-3"], "expected a whole number from 1"),
    (["--headroom", "-0.1"], "expected a number from 0"),
    (["--slo", "ttft<=5"], "SLO metric 'ttft' is unknown"),
])
def test_bad_input_is_one_line(db: Path, argv: list[str], message: str) -> None:
    base = {"--slo": "ttft_ms<=500", "--users": "10"}
    for i in range(0, len(argv), 2):
        base.pop(argv[i], None)
    args = [*argv, *(x for kv in base.items() for x in kv)]
    out = cli("capacity", "--db", str(db), "1", *args).check()
    assert out.code == 2 and message in out.err and len(out.err.strip().splitlines()) == 1, out


def test_help_prints(db: Path) -> None:
    out = cli("capacity", "--help").check()
    assert out.code == 0 and "--tokens-per-day" in out.out and "NAME=USD_PER_HOUR" in out.out


def test_capacity_needs_a_target_a_known_run_and_a_configuration(db: Path) -> None:
    out = cli("capacity", "--db", str(db), "1", "--slo", "ttft_ms<=500").check()
    assert out.code == 2 and "--users N" in out.err
    out = cli("capacity", "--db", str(db), "99", "--slo", "ttft_ms<=500", "--users", "1").check()
    assert out.code == 2 and "no run '99'" in out.err
    out = cli("capacity", "--db", str(db), "bench", "--slo", "ttft_ms<=500", "--users", "1").check()
    assert out.code == 2 and "run 5 was imported from vllm bench serve: x.json: it records no engine" in out.err


def test_plan_refuses_zero_users_directly(db: Path) -> None:
    with RunStore(db) as store:
        run = store.get_run(1)
    with pytest.raises(UserError, match="at least 1"):
        plan_capacity(run, "ttft_ms<=500", default_prices(), users=0)
    plan = plan_capacity(run, "ttft_ms<=500", default_prices(), users=1)
    assert plan.replicas == 1 and plan.usd_per_million_output == CostFigure(pytest.approx(1.9212963))


# --- prices from a profile ------------------------------------------------------------------------

def test_a_profiles_prices_cost_its_runs_and_yours_win(tmp_path: Path) -> None:
    from app.profiles import profile_from_toml

    config = profile_from_toml('name = "negotiated"\n[prices]\nH100 = 1.80\ncpu = 0.02\n')
    assert config.prices == {"H100": 1.8, "cpu": 0.02}
    path = tmp_path / "profile-prices.db"
    with RunStore(path) as store:
        _store_run(store, "negotiated", {"engine": GPU_ENGINE, "prices": config.prices}, [(16, 1440.0, 400.0)],
                   hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
        _store_run(store, "list price", {"engine": GPU_ENGINE}, [(16, 1440.0, 400.0)],
                   hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
        _store_run(store, "cpu", {"prices": config.prices}, [(2, 20.0, 300.0)],
                   hardware={"cpu_model": "Xeon", "cpu_count_logical": 4})
    argv = ("--slo", "ttft_ms<=500", "--users", "16", "--json")
    profile = json.loads(capacity(path, "1", *argv).out)
    assert profile["price"]["usd_per_hour"] == 1.8 and profile["price"]["source"] == "the run's profile price"
    assert profile["usd_per_million_output"]["usd"] == pytest.approx(1.8 / (1440 * 3600) * 1e6)
    assert json.loads(capacity(path, "2", *argv).out)["price"]["source"] == DEFAULT  # its profile had none
    yours = json.loads(capacity(path, "1", *argv, "--price", "H100=3.00").out)
    assert yours["price"]["usd_per_hour"] == 3.0 and yours["price"]["source"] == "your price"
    assert not any("priced nothing" in n for n in yours["notes"])
    cpu = json.loads(capacity(path, "3", "--slo", "ttft_ms<=500", "--users", "2", "--json").out)
    assert cpu["price"]["usd_per_hour"] == 0.02 and cpu["price"]["source"] == "the run's profile price"
    out = cli("compare", "--db", str(path), "1", "2").check()
    assert out.code == 0 and "the run's profile price" in out.out and DEFAULT in out.out


@pytest.mark.parametrize(("toml", "message"), [
    ('[prices]\nH100 = "abc"\n', "price of H100: 'abc' is not a number"),
    ("[prices]\nH100 = -2\n", "price of H100: the price must be above 0"),
    ("[prices]\nH100 = inf\n", "price of H100: the price must be a finite number"),
    ("prices = 3\n", "prices: Input should be a valid dictionary"),
])
def test_a_bad_price_in_a_profile_is_refused_in_one_line(toml: str, message: str) -> None:
    from app.profiles import ProfileError, profile_from_toml

    with pytest.raises(ProfileError) as caught:
        profile_from_toml(toml, "shop.toml")
    text = str(caught.value)
    assert text.startswith("shop.toml: invalid profile: prices") and message in text and "\n" not in text


def test_a_corrupt_stored_price_leaves_the_run_unpriced_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "corrupt-price.db"
    with RunStore(path) as store:
        _store_run(store, "bad", {"engine": GPU_ENGINE, "prices": {"H100": "lots"}}, [(16, 1440.0, 400.0)],
                   hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
        _store_run(store, "good", {"engine": GPU_ENGINE}, [(16, 1440.0, 400.0)],
                   hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
    out = cli("capacity", "--db", str(path), "1", "--slo", "ttft_ms<=500", "--users", "4").check()
    assert out.code == 2 and "run 1 has no valid stored configuration: prices: " in out.err
    assert "price of H100: 'lots' is not a number" in out.err
    assert len(out.err.strip().splitlines()) == 1
    compared = cli("compare", "--db", str(path), "1", "2").check()
    assert compared.code == 0 and "'lots' is not a number" in compared.out  # the other run is still priced


# --- good output re-counted under the SLO asked now -----------------------------------------------

def _requests_run(store: RunStore, slo: str, seed: int = 7) -> tuple[int, list[Any]]:
    """One level of 200 requests with spread TTFT, TPOT and lengths (one-token outputs and a
    failure among them, within capacity's 1% error budget), recorded as the runner records them, its goodput counted under ``slo``."""
    from app.load.aggregate import summarize
    from app.load.metrics import RequestRecord

    rng = np.random.default_rng(seed)
    records = []
    for i in range(200):
        out = int(rng.choice([1, 8, 32, 64]))
        ttft = float(rng.uniform(50, 900))
        tpot = float(rng.uniform(5, 60))
        e2e = ttft + tpot * (out - 1)
        records.append(RequestRecord(level=0, index=i, scheduled_s=0.05 * i, start_s=0.05 * i,
                                     start_wall_s=1.9e9 + 0.05 * i, queue_ms=0.2, ttft_ms=ttft,
                                     tpot_ms=tpot if out > 1 else None, e2e_ms=e2e, input_tokens=100,
                                     output_tokens=out, ok=i != 5, itl_ms=[tpot] * (out - 1)))
    summary = summarize(records, 10.0, slo=slo)
    run_id = store.create_run(name="spread", engine_kind="vllm", engine_version="0.11.0", started_at=1.9e9,
                              config={"name": "spread", "engine": GPU_ENGINE, "load": {"concurrency": 8, "slo": slo}},
                              hardware={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
    store.write_batch(run_id, requests=[r.model_dump(mode="json") for r in records])
    store.start_level(run_id, 0, "concurrency 8", {"mode": "closed", "concurrency": 8}, started_at=1.9e9)
    store.finish_level(run_id, 0, summary.model_dump(mode="json"), 1.9e9 + 10)
    store.finish_run(run_id, "completed")
    return run_id, records


@pytest.mark.parametrize("slo", ["ttft_ms<=400", "ttft_ms<=600,tpot_ms<30", "e2e_ms<1500", "tpot_ms<=20"])
def test_the_recount_agrees_with_the_runs_own_goodput(tmp_path: Path, slo: str) -> None:
    from app.cost import recount_good
    from app.load.metrics import meets_slo
    from app.slo import parse_slo

    with RunStore(tmp_path / "recount.db") as store:
        run_id, records = _requests_run(store, slo)
        run = store.get_run(run_id)
        requests = store.requests(run_id)
    count = recount_good(requests, 0, parse_slo(slo), 10.0)
    assert count is not None
    assert count.requests == run.levels[0].summary["good_requests"]  # the runner's own count, request by request
    good = [r for r in records if meets_slo(r, parse_slo(slo))]
    assert count.output_tokens == sum(r.output_tokens for r in good) and count.output_tok_per_s == count.output_tokens / 10
    assert 0 < count.requests < 199  # the SLOs cut through the spread


def test_capacity_recounts_good_output_at_the_slo_asked(tmp_path: Path) -> None:
    from app.cost import recount_good
    from app.slo import parse_slo

    path = tmp_path / "recount.db"
    with RunStore(path) as store:
        run_id, _records = _requests_run(store, "ttft_ms<=400")
        requests = store.requests(run_id)
    asked = "ttft_ms<=800"  # looser than the run's own: more requests are good
    count = recount_good(requests, 0, parse_slo(asked), 10.0)
    assert count is not None
    data = json.loads(capacity(path, str(run_id), "--slo", asked, "--percentile", "p50", "--users", "8",
                               "--json").out)
    assert data["good_output_slo"] == "your SLO, re-counted per request"
    assert data["usd_per_million_good_output"]["usd"] == pytest.approx(2.49 / (count.output_tok_per_s * 3600) * 1e6)
    never = json.loads(capacity(path, str(run_id), "--slo", "ttft_ms<=900,tpot_ms<=1", "--percentile", "p50",
                                "--users", "8", "--json").out)  # p50 TPOT is above 1 ms: unreachable, no figures
    assert not never["reachable"] and never["usd_per_million_good_output"] is None
    queue = json.loads(capacity(path, str(run_id), "--slo", "queue_ms<=100", "--percentile", "p50", "--users", "8",
                                "--json").out)  # stored requests keep no queueing: the run's own count, said so
    assert queue["good_output_slo"] == "the run's SLO 'ttft_ms<=400'"


def test_an_imported_run_is_sized_on_the_gpus_per_replica_you_say(db: Path) -> None:
    """Another tool's result records no parallelism: --gpus-per-replica (and --gpu) say what one
    replica ran on. 100 output tok/s a replica is 8.64M tokens a day; 1e8 a day with 30% headroom
    is ceil(1e8 x 1.3 / 8.64e6) = 16 replicas = 32 GPUs at 2 a replica."""
    out = capacity(db, "bench", "--slo", "ttft_ms<=500", "--tokens-per-day", "1e8", "--gpus-per-replica", "2",
                   "--gpu", "H100")
    assert out.code == 0, out
    assert "replica: 2 GPUs of H100 (2 GPUs per replica, as you said (--gpus-per-replica)" in out.out
    assert "answer: 16 replicas = 32 GPUs" in out.out, out.out
    assert "note: one replica measured: the imported run says nothing of data parallelism" in out.out
    as_json = json.loads(capacity(db, "bench", "--slo", "ttft_ms<=500", "--tokens-per-day", "1e8",
                                  "--gpus-per-replica", "2", "--gpu", "H100", "--json").out)
    assert (as_json["replicas"], as_json["units"], as_json["deployment"]["units_per_replica"]) == (16, 32, 2)
    missing = capacity(db, "bench", "--slo", "ttft_ms<=500", "--tokens-per-day", "1e8")
    assert missing.code == 2 and "say what it ran on with --gpus-per-replica N" in missing.err
    no_gpu = capacity(db, "bench", "--slo", "ttft_ms<=500", "--tokens-per-day", "1e8", "--gpus-per-replica", "2")
    assert no_gpu.code == 2 and "records no GPU: pass --gpu NAME too" in no_gpu.err
    own = capacity(db, "tp4 sweep", "--slo", "ttft_ms<=500", "--users", "10", "--gpus-per-replica", "2")
    assert own.code == 2 and "records its own parallelism: --gpus-per-replica is only for an imported run" in own.err
    zero = capacity(db, "bench", "--slo", "ttft_ms<=500", "--users", "1", "--gpus-per-replica", "0")
    assert zero.code == 2 and "--gpus-per-replica: expected a whole number from 1" in zero.err
