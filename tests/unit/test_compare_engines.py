"""Compare across engines says what each engine was given, in its own words: the CLI
table, the --json comparison and the HTML report carry the same terms, from the adapters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.analysis.compare import compare_runs
from app.export.report import render_report
from app.store import RunStore
from engine_adapters.config import Features
from engine_adapters.registry import ADAPTERS, engine_terms_for

REPO = Path(__file__).resolve().parents[2]


def _stored(store: RunStore, name: str, kind: str, features: dict[str, object]) -> int:
    run_id = store.create_run(name=name, engine_kind=kind, model="tunebench:demo", started_at=1.9e9, t0_mono=0.0,
                              config={"name": name, "engine": {"kind": kind}, "features": features})
    store.finish_run(run_id, "completed", None, {}, 1.9e9 + 5.0)
    return run_id


@pytest.fixture
def two_engines(tmp_path: Path) -> tuple[Path, int, int]:
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        vllm = _stored(store, "vllm fp8 kv", "vllm", {"kv_cache_dtype": "fp8", "max_num_seqs": 8})
        llama = _stored(store, "llama q8 kv", "llamacpp", {"kv_cache_dtype": "q8_0", "max_num_seqs": 4})
    return db, vllm, llama


def test_each_engine_speaks_for_every_feature_it_renders() -> None:
    busy = Features(kv_cache_dtype="fp8", prefix_caching=True, max_num_seqs=8, max_model_len=2048)
    for kind, adapter in ADAPTERS.items():
        terms = adapter.engine_terms(busy)
        assert terms.get("max_num_seqs"), kind  # every engine has a batch limit of its own
        assert "8" in terms["max_num_seqs"], (kind, terms)
        assert adapter.engine_terms(Features()) == {} or kind == "trtllm", kind  # defaults: nothing given


def test_cli_json_and_report_show_the_difference_in_each_engines_terms(two_engines: tuple[Path, int, int]) -> None:
    db, vllm, llama = two_engines
    with RunStore(db) as store:
        comparison = compare_runs(store, [vllm, llama], series=False, engine_terms_of=engine_terms_for)
        html = render_report(comparison, store=store)
    assert comparison.engine_terms["features.kv_cache_dtype"] == ["--kv-cache-dtype fp8", "-ctk q8_0 -ctv q8_0"]
    assert comparison.engine_terms["features.max_num_seqs"] == ["--max-num-seqs 8", "-np 4"]
    doc = comparison.to_dict()
    row = next(r for r in doc["config_diff"] if r["key"] == "features.kv_cache_dtype")
    assert row["engine_terms"] == ["--kv-cache-dtype fp8", "-ctk q8_0 -ctv q8_0"]
    assert "-ctk q8_0 -ctv q8_0" in html and "--kv-cache-dtype fp8" in html
    out = subprocess.run([sys.executable, "-m", "app.cli", "compare", str(vllm), str(llama), "--db", str(db)],
                         capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("features.kv_cache_dtype"))
    assert lines[at + 1].strip().startswith("as given to the engine")
    assert "--kv-cache-dtype fp8" in lines[at + 1] and "-ctk q8_0 -ctv q8_0" in lines[at + 1]
    assert json.dumps(doc)  # the comparison stays JSON


def test_every_face_passes_the_engines_terms_and_the_store_alone_has_none(two_engines: tuple[Path, int, int]) -> None:
    """The store knows no engine (an import-linter contract): the terms come from what app passes
    in, so each face must pass it: the GUI's Compare and the report here, the CLI above."""
    from app.export.report import report_comparison
    from app.gui.history import compare_with_extras

    db, vllm, llama = two_engines
    with RunStore(db) as store:
        assert compare_runs(store, [vllm, llama], series=False).engine_terms == {}
        shown, _extras = compare_with_extras(store, [vllm, llama])
        reported = report_comparison(store, [vllm, llama])
        alone = report_comparison(store, [llama])
    for comparison in (shown, reported):
        assert comparison.engine_terms["features.kv_cache_dtype"] == ["--kv-cache-dtype fp8", "-ctk q8_0 -ctv q8_0"]
    assert alone.engine_terms == {}  # one run: nothing differs
    assert engine_terms_for("no-such-engine", {}) is None
    assert engine_terms_for("vllm", {"kv_cache_dtype": "fp9"}) is None  # no longer validates: none, no error
