"""Counting lengths in the model's tokens.

Prompt lengths mean something only in the served model's tokens. When its ``tokenizer.json`` is
on this machine (a local model folder, an explicit path, or the Hugging Face cache) lengths are
exact; otherwise they are approximated (one token per word or punctuation mark) and every result
says so (``TokenCounter.exact`` is False, ``source`` names the method).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

_WORD_RE = re.compile(r"\w+|[^\w\s]")


class TokenCounter(Protocol):
    exact: bool
    source: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def count(self, text: str) -> int: ...


class HfTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local tokenizer.json."""

    exact = True

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.source = f"tokenizer {path}"

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class ApproxTokenizer:
    """One token per word or punctuation mark: the labelled fallback when no tokenizer is local."""

    exact = False
    source = "approximate (1 token per word or punctuation mark; no local tokenizer)"

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}
        self._words: list[str] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in _WORD_RE.findall(text):
            if word not in self._vocab:
                self._vocab[word] = len(self._words)
                self._words.append(word)
            ids.append(self._vocab[word])
        return ids

    def decode(self, ids: list[int]) -> str:
        return " ".join(self._words[i] for i in ids)

    def count(self, text: str) -> int:
        return len(_WORD_RE.findall(text))


def _hf_cache_candidates(model_id: str) -> list[Path]:
    """Snapshots of a hub id in the local Hugging Face cache (never downloads)."""
    if "/" not in model_id or model_id.startswith(("/", ".", "~")):
        return []
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / f"models--{model_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return []
    return sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)


def find_tokenizer_file(*candidates: str | None) -> Path | None:
    """The first tokenizer.json found among paths, model folders and hub ids (local only)."""
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate).expanduser()
        if path.is_file() and path.name.endswith(".json"):
            return path
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        for snapshot in _hf_cache_candidates(candidate):
            if (snapshot / "tokenizer.json").is_file():
                return snapshot / "tokenizer.json"
    return None


def load_token_counter(*candidates: str | None) -> TokenCounter:
    """An exact tokenizer when one is found locally, else the approximate one."""
    path = find_tokenizer_file(*candidates)
    if path is not None:
        try:
            return HfTokenizer(path)
        except Exception:  # a broken or foreign tokenizer.json: fall back, labelled
            pass
    return ApproxTokenizer()
