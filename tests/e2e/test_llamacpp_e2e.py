"""llama.cpp for real (the llamacpp-cpu runtime, the GGUF demo model): the GGUF is the same model
and tokenizer as vLLM's, the engine starts with its toggles verified by effect, the load client's
token count equals the engine's own counter, telemetry reads its ``llamacpp:*`` metrics, it stops
with nothing left behind, the shipped profile runs from ``tunebench run``, and the same workload
on vLLM and llama.cpp compares side by side (``tunebench compare``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from app.bus import Bus, Sample
from app.config import RunConfig
from app.recording import RunRecorder
from app.runner import Runner, RunResult
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import GGUF_WEIGHT_BITS, EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess, group_members, registered_engines
from engine_adapters.llamacpp_runtime import CONVERTER, ensure_gguf_demo_model, quantized_gguf_path
from engine_adapters.runtimes import COMPLETE_MARKER, MANAGED_RUNTIMES, demo_model_dir

pytestmark = pytest.mark.e2e

RUNTIME = MANAGED_RUNTIMES["llamacpp-cpu"]
ENGINE = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
WORKLOAD = WorkloadConfig(kind="random", num_requests=24, input_len=LengthSpec(mean=64), output_len=LengthSpec(mean=32))
LOAD = LoadConfig(concurrency=4, warmup_requests=1)


@pytest.fixture(scope="module")
def gguf() -> Path:
    if not RUNTIME.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    return ensure_gguf_demo_model(str(RUNTIME.interpreter))


def _post(engine: EngineProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(engine.base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **engine.auth_headers()})
    with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 - loopback
        result: dict[str, object] = json.loads(resp.read())
        return result


def run_on(engine: EngineProcess, bus: Bus | None = None, telemetry: bool = False) -> RunResult:
    config = RunConfig(name="llamacpp e2e", engine=engine.engine, features=engine.features, workload=WORKLOAD, load=LOAD)
    result = Runner(config, bus or Bus(), engine=engine, telemetry=telemetry, keep_requests=True).run()
    assert result.status == "completed", result.reason
    return result


def test_gguf_is_deterministic_and_tokenizes_as_the_hf_tokenizer(engine_pool, gguf: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Converted twice, the same bytes as the cached file; served, the same token ids as the
    Hugging Face tokenizer vLLM uses (so both engines see the same prompts)."""
    from tokenizers import Tokenizer

    out = tmp_path / "again.gguf"
    subprocess.run([str(RUNTIME.interpreter), str(CONVERTER), str(demo_model_dir()), str(out)], check=True,
                   capture_output=True, timeout=300)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(gguf.read_bytes()).hexdigest()
    marker = json.loads((gguf.parent / COMPLETE_MARKER).read_text())
    assert marker["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest() and marker["vocab"] == 512

    hf = Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))
    engine = engine_pool.get(Features(), ENGINE)
    texts = ["the quick brown fox jumps over the lazy dog.", "def f(x):\n    return x + 42\n",
             "  two  spaces, digits 12345 and 'quotes' don't", "ünïcödé — ok?"]
    for text in texts:
        served = _post(engine, "/tokenize", {"content": text, "add_special": False})["tokens"]
        assert served == hf.encode(text).ids, text
        assert _post(engine, "/detokenize", {"tokens": served})["content"] == text


def test_llamacpp_engine_end_to_end(gguf: Path) -> None:
    """Start with toggles, verify them by effect, drive load, count tokens against the engine's
    own counter, read its metrics on the telemetry timeline, stop with nothing left."""
    features = Features(prefix_caching=True, kv_cache_dtype="q8_0", max_num_seqs=4, max_model_len=1024)
    engine = EngineProcess(ENGINE, features)
    engine.start()
    try:
        ready = engine.wait_ready(timeout_s=300)
        assert "--api-key" not in engine.argv and engine.api_key not in " ".join(engine.argv)
        assert ready.kv_cache["kv_cache_tokens"] == 4096 and ready.kv_cache["max_concurrency"] == 4
        checks = {c.key: c for c in engine.verify_features()}
        print("\n" + "\n".join(f"{c.key}: {c.status}: {c.evidence}" for c in checks.values()))
        assert checks["kv_cache_dtype"].status == "verified"  # 1.06 bytes per value allocated, not f16's 2
        assert checks["prefix_caching"].status == "verified"
        assert checks["max_num_seqs"].status == "accepted"

        bus = Bus()
        engine_samples = bus.subscribe(kinds=(Sample,), sources=("engine",))
        result = run_on(engine, bus, telemetry=True)
        samples = [x for x in engine_samples.drain() if isinstance(x, Sample)]
        for level in result.levels:
            s = level.summary
            assert s.errors == 0, s.error_examples
            assert len(level.requests) == s.completed > 0
            for rec in level.requests:
                assert rec.output_tokens == rec.expected_output_tokens  # ignore_eos: the asked length
            assert s.engine.generation_tokens is not None
            assert s.output_tokens == int(s.engine.generation_tokens), (s.output_tokens, s.engine.generation_tokens)
            assert s.tokens_match_engine is True
            print(f"level {level.label}: {s.completed} requests, {s.output_tokens} tokens (engine counted "
                  f"{s.engine.generation_tokens:.0f}), {s.output_tok_per_s:.0f} tok/s, tokens from "
                  f"{s.tokens_source}, TTFT p50 {s.ttft_ms.median:.1f} ms")
        rates = [x.values.get("generation_tok_per_s") for x in samples if x.values.get("generation_tok_per_s")]
        print(f"engine samples: {len(samples)}, generation tok/s seen: {[round(r) for r in rates[:5]]}")
        assert rates, "no llamacpp:tokens_predicted_total rate on the telemetry timeline"
    finally:
        how = engine.stop()
    assert engine.pid is not None and group_members(engine.pid) == [], how
    assert not [r for r in registered_engines() if r.pid == engine.pid]


def test_a_block_type_loses_less_the_more_bits_it_keeps() -> None:
    """A tensor quantized and restored with the gguf package (the runtime's, which makes the
    files): Q8_0 keeps it closer than Q4_0, and neither is exact."""
    code = ("import importlib.util, json, sys; import numpy as np; "
            "spec = importlib.util.spec_from_file_location('llamacpp_gguf', sys.argv[1]); "
            "g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g); "
            "v = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32); "
            "print(json.dumps({t: g.roundtrip_rms_error(v, t) for t in sys.argv[2:]}))")
    done = subprocess.run([str(RUNTIME.interpreter), "-c", code, str(CONVERTER), *GGUF_WEIGHT_BITS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    error = json.loads(done.stdout)
    print(f"\nRMS error of a unit normal tensor: {error}")
    assert 0 < error["q8_0"] < error["q4_0"] < 0.2  # 8 bits: ~1% of the spread; 4 bits: ~10%


def test_quantized_weights_serve_tokens_the_engine_counts(engine_pool, gguf: Path) -> None:  # type: ignore[no-untyped-def]
    """q8_0 and q4_0 made from the 16-bit GGUF (cached beside it), loaded as that type (verified
    from the engine's log), serving the asked tokens that its own counter counts."""
    sizes = {"bf16": gguf.stat().st_size}
    for dtype in GGUF_WEIGHT_BITS:
        engine = engine_pool.get(Features(weights_dtype=dtype), ENGINE)  # type: ignore[arg-type]
        made = quantized_gguf_path(gguf, dtype)
        assert engine.argv[engine.argv.index("-m") + 1] == str(made) and made.parent == gguf.parent
        sizes[dtype] = made.stat().st_size
        check = {c.key: c for c in engine.verify_features()}["weights_dtype"]
        assert check.status == "verified", check.evidence
        result = run_on(engine)
        summary = result.levels[0].summary
        assert summary.errors == 0 and summary.completed == WORKLOAD.num_requests, summary.error_examples
        assert summary.tokens_match_engine is True
        assert summary.output_tokens == int(summary.engine.generation_tokens or 0) > 0
        print(f"\n{dtype}: {check.evidence}; {summary.output_tokens} tokens, {summary.output_tok_per_s:.0f} tok/s")
    assert sizes["bf16"] > sizes["q8_0"] > sizes["q4_0"], sizes


def test_shipped_profile_runs_from_tunebench_run(gguf: Path, tmp_path: Path, repo_root: Path) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "TUNEBENCH_DB": str(tmp_path / "runs.db")}
    done = subprocess.run([sys.executable, "-m", "app.cli", "run", "llamacpp-cpu-demo", "--json", str(out),
                           "--no-telemetry"], cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["config"]["engine"]["kind"] == "llamacpp"
    assert result["engine_version"] == "xllamacpp-" + RUNTIME.version
    level = result["levels"][0]["summary"]
    assert level["completed"] == 64 and level["errors"] == 0 and level["tokens_match_engine"] is True
    assert {c["key"]: c["status"] for c in result["feature_checks"]}["prefix_caching"] == "verified"


def test_same_workload_on_vllm_and_llamacpp_compares_side_by_side(engine_pool, demo_engine: EngineProcess,  # type: ignore[no-untyped-def]
                                                                  gguf: Path, tmp_path: Path, repo_root: Path) -> None:
    db = tmp_path / "runs.db"
    ids = []
    with RunStore(db) as store:
        for engine in (demo_engine, engine_pool.get(Features(prefix_caching=True), ENGINE)):
            bus = Bus()
            recorder = RunRecorder(bus, store)
            config = RunConfig(name=f"same workload on {engine.engine.kind}", engine=engine.engine,
                               features=engine.features, workload=WORKLOAD, load=LOAD)
            try:
                result = Runner(config, bus, engine=engine, telemetry=False).run()
            finally:
                recorder.close()
            assert result.status == "completed", result.reason
            summary = result.levels[0].summary
            assert summary.errors == 0 and summary.tokens_match_engine is True, summary.error_examples
            ids.append(str(recorder.recorded[-1]))
    done = subprocess.run([sys.executable, "-m", "app.cli", "compare", *ids, "--db", str(db), "--json", "--no-series"],
                          cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    comparison = json.loads(done.stdout)
    diff = {d["key"]: d["values"] for d in comparison["config_diff"]}
    assert diff["engine.kind"] == ["vllm", "llamacpp"], diff  # the configuration difference names the engines
    metrics = {m["name"]: m for m in comparison["metrics"]}
    throughput = metrics["output_tok_per_s"]["values"]
    assert all(v is not None and v > 0 for v in throughput), throughput  # one figure per engine, side by side
    human = subprocess.run([sys.executable, "-m", "app.cli", "compare", *ids, "--db", str(db)], cwd=repo_root,
                           capture_output=True, text=True, timeout=300)
    assert human.returncode == 0, human.stderr[-2000:]
    print("\n" + human.stdout)
    assert "llamacpp" in human.stdout and "vllm" in human.stdout

