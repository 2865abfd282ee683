"""Workloads: seeded, lengths exact in the model's tokens, imports that fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.load.datasets import DatasetError, build_dataset, sample_lengths
from app.load.tokens import ApproxTokenizer, HfTokenizer, find_tokenizer_file, load_token_counter
from app.workload import LengthSpec, WorkloadConfig


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE like the demo model's, trained here (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [("the quick brown fox jumps over the lazy dog river stone cloud. " * 3
               + f"def f(x):\n    return x + {i}\n") for i in range(100)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    folder = tmp_path_factory.mktemp("model")
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def counter(tokenizer_file: Path) -> HfTokenizer:
    return HfTokenizer(tokenizer_file)


@pytest.mark.parametrize("kind", ["random", "code", "multi_turn"])
def test_fixed_lengths_are_exact_in_model_tokens(counter: HfTokenizer, kind: str) -> None:
    w = WorkloadConfig(kind=kind, num_requests=12, turns=3, input_len=LengthSpec(mean=57), output_len=LengthSpec(mean=9))
    ds = build_dataset(w, counter)
    assert ds.lengths_exact and "tokenizer" in ds.length_source
    turns = [t for c in ds.conversations for t in c.turns]
    assert len(turns) == 12 * (3 if kind == "multi_turn" else 1)
    for t in turns:
        assert t.input_tokens == 57 == counter.count(t.user)
        assert t.output_tokens == 9


def test_long_context_length_includes_the_question(counter: HfTokenizer) -> None:
    ds = build_dataset(WorkloadConfig(kind="long_context", num_requests=3, input_len=LengthSpec(mean=600)), counter)
    for conv in ds.conversations:
        assert conv.turns[0].user.rstrip().endswith("Answer:")
        assert abs(counter.count(conv.turns[0].user) - 600) <= 2


def test_same_seed_same_prompts_other_level_other_prompts(counter: HfTokenizer) -> None:
    w = WorkloadConfig(num_requests=5, input_len=LengthSpec(distribution="normal", mean=40, spread=10))
    a, b = build_dataset(w, counter), build_dataset(w, counter)
    assert [c.turns[0].user for c in a.conversations] == [c.turns[0].user for c in b.conversations]
    other = build_dataset(w, counter, variant=1)
    assert [c.turns[0].user for c in a.conversations] != [c.turns[0].user for c in other.conversations]


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_length_distributions_are_clipped_and_centred(dist: str) -> None:
    spec = LengthSpec(distribution=dist, mean=100, spread=30, minimum=80, maximum=150)
    values = sample_lengths(spec, 4000, np.random.default_rng(0))
    assert min(values) >= 80 and max(values) <= 150
    assert 95 < float(np.mean(values)) < 112  # clipping at 80 pulls the mean up a little
    assert len(set(values)) > 20


def test_shared_prefix_is_carried_by_the_asked_fraction(counter: HfTokenizer) -> None:
    w = WorkloadConfig(kind="shared_prefix", num_requests=20, shared_prefix_tokens=64, shared_prefix_fraction=0.25)
    ds = build_dataset(w, counter)
    carriers = [c for c in ds.conversations if c.system]
    assert len(carriers) == 5
    assert len({c.system for c in carriers}) == 1
    assert carriers[0].system_tokens == 64 == counter.count(carriers[0].system or "")


def test_without_a_tokenizer_lengths_are_approximate_and_labelled(tmp_path: Path) -> None:
    counter = load_token_counter(str(tmp_path), None, "no-such-org/no-such-model")
    assert isinstance(counter, ApproxTokenizer) and not counter.exact
    ds = build_dataset(WorkloadConfig(num_requests=2, input_len=LengthSpec(mean=30)), counter)
    assert not ds.lengths_exact and "approximate" in ds.length_source
    assert all(counter.count(c.turns[0].user) == 30 for c in ds.conversations)


def test_tokenizer_found_in_model_folder_and_hf_cache(tokenizer_file: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_tokenizer_file(None, str(tokenizer_file.parent)) == tokenizer_file
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").write_text(tokenizer_file.read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_tokenizer_file("org/m") == snap / "tokenizer.json"
    assert load_token_counter("org/m").exact


def test_a_broken_tokenizer_file_falls_back(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer")
    assert not load_token_counter(str(tmp_path)).exact


def _sharegpt(path: Path, entries: object) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


def test_sharegpt_import(tmp_path: Path, counter: HfTokenizer) -> None:
    entries = [{"conversations": [{"from": "human", "value": f"tell me about the river number {i} please"},
                                  {"from": "gpt", "value": "the river " * (i + 2)}]} for i in range(6)]
    entries.append({"id": "broken"})
    entries.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]})  # < 4 tokens
    w = WorkloadConfig(kind="sharegpt", dataset_path=_sharegpt(tmp_path / "sg.json", entries), num_requests=10)
    ds = build_dataset(w, counter)
    assert len(ds.conversations) == 10  # cycled over the 6 usable
    assert any("skipped 1 of 8" in n for n in ds.notes)
    for conv in ds.conversations:
        assert conv.turns[0].user.startswith("tell me about")
        assert conv.turns[0].output_tokens == counter.count("the river " * (int(conv.turns[0].user.split()[6]) + 2))


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a"}\n{"prompt": "b"}\n', "not a ShareGPT JSON file"),  # a JSONL file claiming to be ShareGPT
    ('{"conversations": []}', "expected a list of conversations"),
    ("[1, 2, 3]", "no usable ShareGPT conversations"),
])
def test_sharegpt_that_is_not_sharegpt(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "data.json"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        build_dataset(WorkloadConfig(kind="sharegpt", dataset_path=str(path)), ApproxTokenizer())


def test_binary_and_missing_dataset_files(tmp_path: Path) -> None:
    binary = tmp_path / "data.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DatasetError, match="not UTF-8"):
        build_dataset(WorkloadConfig(kind="jsonl", dataset_path=str(binary)), ApproxTokenizer())
    with pytest.raises(DatasetError, match="no such JSONL file"):
        build_dataset(WorkloadConfig(kind="jsonl", dataset_path=str(tmp_path / "nope.jsonl")), ApproxTokenizer())


def test_jsonl_keeps_good_lines_and_reports_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "first prompt here", "output_tokens": 7}\n'
                    'not json at all\n'
                    '"a bare string prompt"\n'
                    '{"text": "no prompt key"}\n'
                    '{"prompt": "bad length", "output_tokens": -3}\n\n')
    ds = build_dataset(WorkloadConfig(kind="jsonl", dataset_path=str(path), num_requests=2), ApproxTokenizer())
    prompts = {c.turns[0].user: c.turns[0].output_tokens for c in ds.conversations}
    assert set(prompts) == {"first prompt here", "a bare string prompt"}
    assert prompts["first prompt here"] == 7
    assert ds.notes and "skipped 3 line(s)" in ds.notes[0] and "line 2: not JSON" in ds.notes[0]


def test_jsonl_with_no_usable_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("[1]\n{}\n")
    with pytest.raises(DatasetError, match="no usable prompts"):
        build_dataset(WorkloadConfig(kind="jsonl", dataset_path=str(path)), ApproxTokenizer())


def test_config_rejects_missing_dataset_and_bad_slo() -> None:
    from pydantic import ValidationError

    from app.workload import LoadConfig

    with pytest.raises(ValidationError, match="needs dataset_path"):
        WorkloadConfig(kind="sharegpt")
    with pytest.raises(ValidationError, match="is not like"):
        LoadConfig(slo="ttft=5")
    with pytest.raises(ValidationError, match="needs rate_rps"):
        LoadConfig(pattern="poisson")
    with pytest.raises(ValidationError, match="whole numbers"):
        LoadConfig(pattern="sweep", levels=[1.5])
