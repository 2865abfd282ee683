"""Fixtures of the fuzz suite: a private engine registry per test (no test may see or stop an
engine of another), and a run database seeded with a few runs that every command must leave
intact."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store import RunStore, SampleIn

# A name with a carriage return, an escape sequence and a newline: printed raw, it would recolour
# the terminal and forge a line of output.
EVIL_NAME = "evil\x1b[31mred\r\nforged line\x1b]0;title\x07"
SEEDED_NAMES = ("baseline", "prefix on", EVIL_NAME)


@pytest.fixture(autouse=True)
def _private_engine_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TUNEBENCH_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def _seed(store: RunStore, name: str, ttft_ms: float) -> int:
    run_id = store.create_run(name=name, engine_kind="vllm", model="tunebench:demo", engine_version="0.32.0",
                              config={"name": name, "features": {"prefix_caching": True}}, tags=["seed", name[:8]],
                              notes=f"notes of {name}", t0_mono=100.0, started_at=1.9e9)
    requests = [{"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": ttft_ms, "e2e_ms": ttft_ms + 50.0, "input_tokens": 32,
                 "output_tokens": 8, "itl_ms": [7.0] * 7} for i in range(12)]
    samples = [SampleIn("client", 100.0 + t, 1.9e9 + t, {"output_tok_per_s": 80.0 + t}) for t in range(6)]
    store.write_batch(run_id, requests=requests, samples=samples, log_lines=["INFO engine log line", "\x1b[32mok\x1b[0m"])
    store.finish_run(run_id, "completed", None, {"seeded": 1.0})
    return run_id


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with three completed runs (one with a hostile name). Module-scoped: fuzzed
    commands run against it over and over, and must leave it as it was."""
    path = tmp_path_factory.mktemp("fuzz-db") / "runs.db"
    with RunStore(path) as store:
        for i, name in enumerate(SEEDED_NAMES):
            _seed(store, name, 40.0 + 10 * i)
    return path
