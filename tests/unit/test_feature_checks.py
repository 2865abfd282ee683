"""Active means it worked: features are verified by an effect the engine measured (prefix-cache
hits on a repeated prompt, drafts accepted, the KV capacity the dtype predicts), an echo alone is
"accepted by the engine", and one function words every outcome for the CLI, the GUI and logs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import pytest
from aiohttp import web

from engine_adapters.base import FeatureCheck, feature_check_line, feature_status, feature_status_text
from engine_adapters.config import EngineConfig, Features, SpeculativeConfig
from engine_adapters.launcher import EngineProcess
from engine_adapters.vllm import VllmAdapter, kv_bytes_per_token
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

ADAPTER = VllmAdapter()
ARGS = ("(APIServer pid=1) INFO 11-30 11:33:41 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
        "'port': 44757, 'model': '/m', 'kv_cache_dtype': 'fp8', 'enable_prefix_caching': True, 'max_num_seqs': 8, "
        "'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 3}}")
# Real vLLM 0.32 CPU lines (the demo model, VLLM_CPU_KVCACHE_SPACE=1, --kv-cache-dtype fp8)
FP8_LOG = [
    ARGS,
    "(APIServer pid=1) INFO 11-30 11:33:42 [cache.py:361] Using fp8 data type to store kv cache. It reduces the GPU "
    "memory footprint and boosts the performance.",
    "(Worker pid=2) INFO 11-30 11:35:24 [cpu_worker.py:260] Explicitly set (1.0/8.84) GiB for KV cache on node 0.",
    "(EngineCore pid=3) INFO 11-30 11:35:24 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, "
    "Maximum concurrency for 4,096 tokens per request: 512.00x",
]
DEMO_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "hidden_size": 256}


def metrics(hits: float = 0, queries: float = 0, drafts: float | None = None, accepted: float = 0) -> str:
    text = (f'vllm:prefix_cache_queries_total{{engine="0"}} {queries}\n'
            f'vllm:prefix_cache_hits_total{{engine="0"}} {hits}\n')
    if drafts is not None:
        text += (f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n')
    return text


def checks_of(features: Features, log: list[str], before: str | None, after: str, **kw: object) -> dict[str, FeatureCheck]:
    return {c.key: c for c in ADAPTER.verify(features, log, after, before_text=before, **kw)}  # type: ignore[arg-type]


# --- one wording --------------------------------------------------------------------------------

def test_one_function_words_every_status() -> None:
    verified = FeatureCheck("prefix_caching", "True", "verified", "512 of 1,056 queried tokens hit the prefix cache")
    assert feature_status_text(verified) == "active (verified by 512 of 1,056 queried tokens hit the prefix cache)"
    assert feature_status_text(verified, evidence=False) == "active (verified)"
    echoed = FeatureCheck("max_num_seqs", "8", "accepted", "engine parsed max_num_seqs=8")
    assert feature_status_text(echoed) == "accepted by the engine (engine parsed max_num_seqs=8)"
    assert feature_check_line(FeatureCheck("x", "1", "not active", "e")) == "feature x=1: NOT ACTIVE (e)"
    assert feature_status_text(FeatureCheck("x", "1", "unknown", ""), evidence=False) == "unknown"
    # the dict form (events, stored results) reads the same; a record from before statuses
    # existed said "active" when the engine had only echoed the flag
    assert feature_check_line(asdict(echoed)) == feature_check_line(echoed)
    assert feature_status({"key": "k", "requested": "1", "active": True, "evidence": "echo"}) == "accepted"
    assert feature_status({"key": "k", "requested": "1", "active": None, "evidence": ""}) == "unknown"
    assert verified.active is True and echoed.active is True and FeatureCheck("x", "1", "not active", "").active is False


def test_no_consumer_words_a_check_itself() -> None:
    """The CLI and the GUI print checks only through the one function (the wording used to be
    written four times, each a little different)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for rel in ("app/cli/engine_cmds.py", "app/cli/run_cmds.py", "app/gui/live_tab.py"):
        text = (root / rel).read_text()
        assert '"NOT ACTIVE"' not in text and '"NOT active"' not in text and "not confirmed" not in text, rel
        assert "feature_check_line" in text or "feature_status_text" in text, rel


# --- prefix caching -----------------------------------------------------------------------------

def test_prefix_caching_is_verified_by_hits_in_the_probe() -> None:
    features = Features(prefix_caching=True)
    probe = ADAPTER.probe_requests(features)
    assert len(probe) == 2 and probe[0] == probe[1] and probe[0]["max_tokens"] == 1
    assert len(probe[0]["prompt"]) == 528 and probe[0]["cache_salt"]  # a salt of its own: no stale hits
    check = checks_of(features, [ARGS], metrics(100, 900), metrics(612, 1956))["prefix_caching"]
    assert check.status == "verified" and check.evidence == "prefix-cache hits on 512 of 528 tokens of a repeated prompt"


def test_prefix_caching_echoed_but_never_hit_is_not_active() -> None:
    check = checks_of(Features(prefix_caching=True), [ARGS], metrics(0, 0), metrics(0, 1056))["prefix_caching"]
    assert check.status == "not active"
    assert check.evidence.startswith("no prefix-cache hits on a repeated 528-token prompt (1,056 tokens queried)")


def test_prefix_caching_off_is_verified_by_no_hits() -> None:
    log = [ARGS.replace("'enable_prefix_caching': True", "'enable_prefix_caching': False")]
    assert checks_of(Features(prefix_caching=False), log, metrics(), metrics(0, 1056))["prefix_caching"].status == "verified"
    assert checks_of(Features(prefix_caching=False), log, metrics(), metrics(512, 1056))["prefix_caching"].status == (
        "not active")


def test_without_a_probe_an_echo_is_only_accepted_and_a_failed_probe_says_why() -> None:
    check = checks_of(Features(prefix_caching=True), [ARGS], None, metrics(0, 0))["prefix_caching"]
    assert check.status == "accepted" and check.evidence == "engine parsed enable_prefix_caching=True"
    failed = checks_of(Features(prefix_caching=True), [ARGS], metrics(), metrics(), probe_error="HTTP 400: too long")
    assert failed["prefix_caching"].status == "accepted"
    assert failed["prefix_caching"].evidence.endswith("the probe failed: HTTP 400: too long")
    # hits the engine already counted (a kept engine that served runs) are an effect too
    since = checks_of(Features(prefix_caching=True), [ARGS], None, metrics(812, 900))["prefix_caching"]
    assert since.status == "verified" and "812 of 900 queried tokens" in since.evidence


def test_a_short_max_model_len_shortens_the_probe_and_no_hit_proves_nothing() -> None:
    features = Features(prefix_caching=True, max_model_len=200)
    assert len(ADAPTER.probe_requests(features)[0]["prompt"]) == 198
    check = checks_of(features, [ARGS], metrics(), metrics(0, 396))["prefix_caching"]
    assert check.status == "accepted"  # a block of 128 may not fill: not proof of "off"


# --- speculation --------------------------------------------------------------------------------

SPEC = Features(speculative=SpeculativeConfig(method="ngram"))


def test_speculation_is_verified_by_drafts_and_accepted_tokens() -> None:
    (probe,) = ADAPTER.probe_requests(SPEC)
    assert probe["max_tokens"] == 32 and probe["ignore_eos"] and probe["prompt"][:8] == probe["prompt"][8:16]
    check = checks_of(SPEC, [ARGS], metrics(drafts=5, accepted=2), metrics(drafts=16, accepted=14))["speculative.method"]
    assert check.status == "verified" and "11 drafts proposed and 12 draft tokens accepted" in check.evidence


@pytest.mark.parametrize(("drafts", "accepted", "status"), [(0, 0, "not active"), (9, 0, "accepted")])
def test_speculation_without_drafts_or_acceptance_is_not_verified(drafts: int, accepted: int, status: str) -> None:
    check = checks_of(SPEC, [ARGS], metrics(drafts=0), metrics(drafts=drafts, accepted=accepted))["speculative.method"]
    assert check.status == status, check


def test_speculation_the_engine_did_not_take_is_not_active_whatever_the_metrics() -> None:
    log = [ARGS.replace("'method': 'ngram'", "'method': 'eagle'")]
    assert checks_of(SPEC, log, metrics(drafts=0), metrics(drafts=9, accepted=9))["speculative.method"].status == (
        "not active")


# --- KV-cache dtype -----------------------------------------------------------------------------

def test_kv_bytes_per_token_from_the_model_config() -> None:
    assert kv_bytes_per_token(DEMO_CONFIG, 2) == 2 * 2 * 2 * 64 * 2  # K and V, layers, KV heads, head_dim, bf16
    no_head_dim = {k: v for k, v in DEMO_CONFIG.items() if k != "head_dim"}
    assert kv_bytes_per_token(no_head_dim, 1) == 2 * 2 * 2 * 64  # hidden 256 / 4 heads
    assert kv_bytes_per_token({"text_config": DEMO_CONFIG}, 2) == 1024
    assert kv_bytes_per_token({**DEMO_CONFIG, "kv_lora_rank": 512}, 2) is None  # MLA: another layout
    assert kv_bytes_per_token({}, 2) is None


def test_fp8_kv_cache_is_verified_by_twice_the_tokens() -> None:
    check = checks_of(Features(kv_cache_dtype="fp8"), FP8_LOG, None, "", model_config=DEMO_CONFIG)["kv_cache_dtype"]
    assert check.status == "verified", check
    assert "2,097,152 tokens in 1 GiB, 2.00x the 1,048,576 a 16-bit cache would" in check.evidence


def test_fp8_echoed_but_stored_in_16_bits_is_not_active() -> None:
    log = [line.replace("2,097,152", "1,048,576") for line in FP8_LOG]
    check = checks_of(Features(kv_cache_dtype="fp8"), log, None, "", model_config=DEMO_CONFIG)["kv_cache_dtype"]
    assert check.status == "not active" and "1.00x" in check.evidence, check


def test_fp8_in_a_cache_of_a_few_mib_is_accepted_unchecked() -> None:
    """--kv-cache-memory-bytes 2 MiB: the log rounds the cache to 0.00 GiB, which checks nothing."""
    log = [line.replace("(1.0/8.84)", "(0.00/8.84)").replace("2,097,152", "4,096") for line in FP8_LOG]
    check = checks_of(Features(kv_cache_dtype="fp8"), log, None, "", model_config=DEMO_CONFIG)["kv_cache_dtype"]
    assert check.status == "accepted" and "capacity not checked" in check.evidence, check


def test_fp8_capacity_unchecked_without_the_model_config_is_accepted() -> None:
    check = checks_of(Features(kv_cache_dtype="fp8"), FP8_LOG, None, "", model_config={})["kv_cache_dtype"]
    assert check.status == "accepted" and "capacity not checked" in check.evidence


# --- the launcher sends the probe and reads /metrics around it -----------------------------------

class FakeVllm(FakeOpenAIServer):
    """A fake vLLM whose /metrics count prefix-cache queries and hits the way vLLM's CPU build
    does (blocks of 128 tokens, keyed by salt and content, the last token always computed)."""

    def __init__(self, caching: bool = True, refuse: bool = False) -> None:
        super().__init__(FakeBehaviour(api_key=None))
        self.caching, self.refuse = caching, refuse
        self.queries = self.hits = self.finished = 0
        self.cached: set[tuple[str, tuple[int, ...]]] = set()
        self.bodies: list[dict] = []  # type: ignore[type-arg]

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.refuse:
            return web.json_response({"error": {"message": "prompt too long"}}, status=400)
        prompt = tuple(body["prompt"])
        key = (body.get("cache_salt", ""), prompt[: (len(prompt) - 1) // 128 * 128])
        self.queries += len(prompt)
        if self.caching and key in self.cached:
            self.hits += len(key[1])
        self.cached.add(key)
        self.finished += 1
        return web.json_response({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=metrics(self.hits, self.queries)
                            + f'vllm:request_success_total{{finished_reason="length"}} {self.finished}\n')


def engine_on(server: FakeVllm, features: Features) -> EngineProcess:
    engine = EngineProcess(EngineConfig(require_api_key=False), features)
    engine.port = server.port
    engine.log_lines.append(ARGS)
    return engine


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    with FakeVllm() as srv:
        yield srv


def test_verify_features_probes_and_verifies(fake: FakeVllm) -> None:
    checks = {c.key: c for c in engine_on(fake, Features(prefix_caching=True)).verify_features()}
    assert [b["model"] for b in fake.bodies] == ["fake-model", "fake-model"]
    assert checks["prefix_caching"].status == "verified", checks
    assert "hits on 512 of 528 tokens" in checks["prefix_caching"].evidence


def test_verify_features_sees_caching_that_does_not_work() -> None:
    with FakeVllm(caching=False) as srv:
        check = {c.key: c for c in engine_on(srv, Features(prefix_caching=True)).verify_features()}["prefix_caching"]
    assert check.status == "not active" and "no prefix-cache hits" in check.evidence


def test_verify_features_reports_a_refused_probe() -> None:
    with FakeVllm(refuse=True) as srv:
        check = {c.key: c for c in engine_on(srv, Features(prefix_caching=True)).verify_features()}["prefix_caching"]
    assert check.status == "accepted" and "the probe failed: HTTP 400" in check.evidence and "too long" in check.evidence


def test_verify_features_sends_nothing_when_nothing_needs_a_probe(fake: FakeVllm) -> None:
    checks = engine_on(fake, Features(max_num_seqs=8)).verify_features()
    assert fake.bodies == [] and [c.status for c in checks] == ["accepted"]


# --- the batching limit, from what a run showed --------------------------------------------------

def test_the_batching_limit_is_verified_under_more_load_than_it_allows() -> None:
    from app.bus import Bus
    from app.verification import RunEffects

    bus = Bus()
    effects = RunEffects(bus)
    for running, waiting in ((3, 0), (8, 5), (8, 8), (2, 0)):
        bus.sample("engine", {"requests_running": running, "requests_waiting": waiting})
    bus.sample("client", {"requests_running": 99.0})  # not the engine's gauge
    echoed = asdict(FeatureCheck("max_num_seqs", "8", "accepted", "engine parsed max_num_seqs=8"))
    noted: list[str] = []
    (check,) = effects.refine([echoed], Features(max_num_seqs=8), peak_in_flight=16, note=noted.append)
    effects.close()
    assert check["status"] == "verified" and check["evidence"] == "at most 8 requests ran at once (limit 8) while up to 8 waited"
    assert noted == ["feature max_num_seqs=8: active (verified by at most 8 requests ran at once (limit 8) while up to 8 waited)"]


@pytest.mark.parametrize(("running", "waiting", "in_flight", "status"), [
    (12, 0, 16, "not active"),  # the engine ran more at once than its limit
    (4, 0, 4, "accepted"),  # the run never offered more than the limit: nothing shown either way
    (8, 0, 16, "verified"),  # no waiting seen (a 1 s gauge can miss it), but 16 were in flight
    (None, None, 16, "accepted"),  # no engine telemetry (monitoring off)
])
def test_batching_check_outcomes(running: float | None, waiting: float | None, in_flight: int, status: str) -> None:
    from app.verification import batching_check

    echoed = asdict(FeatureCheck("max_num_seqs", "8", "accepted", "engine parsed max_num_seqs=8"))
    assert batching_check(echoed, 8, running, waiting, in_flight)["status"] == status
    refused = asdict(FeatureCheck("max_num_seqs", "8", "not active", "engine parsed max_num_seqs=None"))
    assert batching_check(refused, 8, 4, 9, 16) == refused  # an engine that did not take it stays NOT ACTIVE
