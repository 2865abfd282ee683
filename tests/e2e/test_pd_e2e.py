"""Disaggregated prefill/decode for real: `tunebench run`'s runner launches the shipped cpu-pd-demo
profile (a prefill and a decode vLLM CPU engine, KV moved by NIXL over UCX/TCP, vllm-router in
front, all on 127.0.0.1, the demo model), sends a short load through the router, and stores each
pool's counters. The client's tokens must be the engines' own: output tokens the decode engine's
generation counter, prompt tokens the prefill engine's prompt counter. One group start (the two
engines start together: 1.5-3 minutes here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.bus import Bus
from app.profiles import load_profile, resolve_profile
from app.recording import RunRecorder
from app.runner import DISAGGREGATED_KEY, Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.launcher import group_members
from engine_adapters.runtimes import RUNTIME_ADDONS
from tests.conftest import engine_available

pytestmark = pytest.mark.e2e

REQUESTS = 8
PROMPT_TOKENS = 300  # more than two of the CPU build's 128-token KV blocks: the decode engine pulls them
OUTPUT_TOKENS = 16


def _pool(pools: list[dict[str, Any]], role: str) -> dict[str, float]:
    found = [p for p in pools if p["role"] == role]
    assert len(found) == 1 and "counters" in found[0], pools
    counters: dict[str, float] = found[0]["counters"]
    return counters


def _total(counters: dict[str, float], name: str) -> float:
    """A counter over its label sets (the router labels its own by worker)."""
    found = [v for k, v in counters.items() if k == name or k.startswith(name + "{")]
    assert found, (name, counters)
    return sum(found)


@pytest.mark.timeout(1500)  # the group's own bounds decide (startup 900 s, requests 600 s), not the suite's 600 s
def test_a_p_d_group_serves_a_run_through_the_router_and_its_pools_count_the_tokens(tmp_path: Path) -> None:
    if not engine_available() or not RUNTIME_ADDONS["vllm-cpu-pd"].is_installed():
        pytest.fail("vLLM CPU runtime, demo model or its P/D add-on missing: run `make engine tools`")
    config = load_profile(resolve_profile("cpu-pd-demo"))
    config = config.model_copy(update={
        "name": "pd e2e", "tags": ["e2e", "pd"],
        "workload": WorkloadConfig(kind="random", num_requests=REQUESTS, input_len=LengthSpec(mean=PROMPT_TOKENS),
                                   output_len=LengthSpec(mean=OUTPUT_TOKENS), ignore_eos=True),
        "load": LoadConfig(concurrency=4, request_timeout_s=600)})
    config.engine.startup_timeout_s = 900  # two engines starting together on a loaded 2-core machine
    bus = Bus()
    with RunStore(tmp_path / "runs.db") as store:
        recorder = RunRecorder(bus, store)
        runner = Runner(config, bus)
        try:
            result = runner.run()
        finally:
            recorder.close()
        group = runner._own_group
        assert group is not None
        run = store.get_run(recorder.run_id)
    assert result.status == "completed", (result.reason, result.notes, group.router_log[-20:])
    ready = [note for note in result.notes if note.startswith("P/D group ready")]
    assert len(ready) == 1 and "warm-up request through it succeeded" in ready[0], result.notes
    print(ready[0])  # how many tries the decode engine's first handshake took (pytest -s shows it)
    # Prefix caching judged where prompts are computed: two identical probes through the router, the prefill
    # engine's counters around them.
    checks = {c["key"]: c for c in result.feature_checks}
    assert checks["prefix_caching"]["status"] == "verified", checks["prefix_caching"]
    level = result.levels[0].summary
    assert (level.completed, level.errors) == (REQUESTS, 0)
    assert level.input_tokens >= REQUESTS * PROMPT_TOKENS and level.output_tokens == REQUESTS * OUTPUT_TOKENS

    pools = result.disaggregated["levels"][0]["pools"]
    prefill, decode, router = _pool(pools, "prefill"), _pool(pools, "decode"), _pool(pools, "router")
    # The client's tokens are the engines' own: the output the decode engine's, the prompts the prefill engine's.
    assert decode["vllm:generation_tokens_total"] == level.output_tokens
    assert prefill["vllm:prompt_tokens_total"] == level.input_tokens
    assert prefill["vllm:generation_tokens_total"] == REQUESTS  # the prefill engine's one token per request
    # The decode engine took the prompts' KV from the prefill engine (whole blocks), computing at most the rest.
    pulled = decode['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}']
    assert 0 < pulled <= level.input_tokens and decode["vllm:nixl_xfer_time_seconds_count"] >= 1
    assert decode.get("vllm:nixl_num_failed_transfers_total", 0.0) == 0
    assert _total(router, "vllm_router_pd_decode_requests_total") == REQUESTS
    assert level.engine.generation_tokens == level.output_tokens and level.tokens_match_engine is True

    # Stored with the run: the per-pool figures, the group's engines and the router.
    stored = run.summary[DISAGGREGATED_KEY]
    assert stored["levels"][0]["pools"] == pools
    assert sorted(e["role"] for e in stored["engines"]) == ["decode", "prefill"]
    assert "--vllm-pd-disaggregation" in stored["router_argv"]
    assert run.endpoint == group.base_url and run.status == "completed"

    # One stop for all: no process of any engine or of the router is left.
    assert group.pids and all(group_members(pid) == [] for pid in group.pids)
