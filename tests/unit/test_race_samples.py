"""A level's sample (one request as it streamed): its secrets are masked as everywhere else, it
survives a run's export and import, and a file's hostile sample is refused in one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.errors import UserError
from app.export.data import run_to_json
from app.export.importers import import_results
from app.load.client import ClientOptions, stream_sample
from app.load.metrics import RequestRecord
from app.store import RunStore
from engine_adapters.secrets import MASK

KEY = "sk-test-0123456789abcdefghij"
MARKS = [(10.0, "The ", 1), (20.0, "header is Authorization: ", 1), (30.0, f"Bearer {KEY[:10]}", 1),
         (40.0, f"{KEY[10:]} ok", 1)]


def _sample() -> dict[str, object]:
    rec = RequestRecord.model_construct(output_tokens=4, ttft_ms=10.0, e2e_ms=40.0, start_wall_s=1.9e9)
    return stream_sample(f"my api_key={KEY} please", MARKS, rec)


def test_a_samples_secrets_are_masked_and_its_pieces_keep_their_times() -> None:
    sample = _sample()
    assert KEY not in sample["prompt"] and MASK in sample["prompt"]
    whole = "".join(sample["text"])
    assert KEY[:10] not in whole and KEY[10:] not in whole and MASK in whole
    assert sample["t_ms"] == [10.0, 20.0, 30.0, 40.0] and sample["tokens"] == [1, 1, 1, 1]
    assert len(sample["text"]) == 4


def _recorded(store: RunStore) -> int:
    run_id = store.create_run(name="sampled", engine_kind="vllm", model="tunebench:demo", started_at=1.9e9)
    store.start_level(run_id, 0, "c=1", {"concurrency": 1}, 1.9e9)
    store.write_batch(run_id, requests=[{"level": 0, "start_wall": 1.9e9, "ttft_ms": 10.0, "e2e_ms": 40.0,
                                         "input_tokens": 8, "output_tokens": 4, "itl_ms": [10.0] * 3, "error": None}])
    store.finish_level(run_id, 0, {"output_tok_per_s": 100.0}, 1.9e9 + 1, sample=_sample())
    store.finish_run(run_id, "completed", None, {}, 1.9e9 + 2)
    return run_id


def test_a_sample_survives_export_and_import(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        original = _recorded(store)
        path = tmp_path / "run.json"
        path.write_text(json.dumps(run_to_json(store, original)))
        (copy_id,) = import_results(store, path)
        assert store.get_run(copy_id).levels[0].sample == store.get_run(original).levels[0].sample is not None


@pytest.mark.parametrize(("change", "said"), [
    ({"t_ms": [10.0, 5.0, 30.0, 40.0]}, "arrival times must not go back"),
    ({"text": ["a"]}, "as long as each other"),
    ({"t_ms": [10.0, "x", 30.0, 40.0]}, "t_ms"),
])
def test_a_files_hostile_sample_is_refused_in_one_line(tmp_path: Path, change: dict[str, object], said: str) -> None:
    with RunStore(tmp_path / "r.db") as store:
        doc = run_to_json(store, _recorded(store))
        doc["run"]["levels"][0]["sample"].update(change)
        path = tmp_path / "run.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(UserError) as info:
            import_results(store, path)
        assert "\n" not in str(info.value) and said in str(info.value) and "levels[0].sample" in str(info.value)


def test_a_level_samples_the_first_request_after_its_first_wave() -> None:
    """At concurrency 2, requests 0 and 1 prefill together; request 2 is the level's sample, and its
    pieces' times are its record's: the first is the TTFT, the last the end."""
    from app.load.datasets import Conversation, Dataset, Turn
    from app.load.executor import LiveStats, StopRule, run_level
    from app.load.patterns import LevelPlan
    from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

    samples: list[dict[str, object]] = []
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.005)) as server:
        opts = ClientOptions(base_url=server.base_url, model="m")
        ds = Dataset([Conversation(i, [Turn("fake:ok", 8, 3)]) for i in range(6)], True, "test")
        out = asyncio.run(run_level(LevelPlan(0, "c=2", "closed", concurrency=2), ds, opts, StopRule(),
                                    live=LiveStats(None, "r1"), on_sample=samples.append))
    (sample,) = samples
    record = next(r for r in out.records if r.index == 2)
    assert sample["start_wall_s"] == record.start_wall_s and sample["output_tokens"] == record.output_tokens
    times = sample["t_ms"]
    assert isinstance(times, list) and record.ttft_ms is not None and record.e2e_ms is not None
    assert abs(times[0] - record.ttft_ms) < 1e-3 and abs(times[-1] - record.e2e_ms) < 1e-3
    assert sum(sample["tokens"]) == record.output_tokens  # type: ignore[arg-type]
