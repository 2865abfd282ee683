"""Counting lengths in the model's tokens.

Prompt lengths mean something only in the served model's tokens. When its ``tokenizer.json`` is
on this machine (a local model folder, an explicit path, or the Hugging Face cache) lengths are
exact; otherwise they are approximated (one token per word or punctuation mark) and every result
says so (``TokenCounter.exact`` is False, ``source`` names the method). A tokenizer the user named
(``workload.tokenizer``) must load: a missing or broken one is an error, never a silent fallback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

from app.errors import UserError, read_user_text

_WORD_RE = re.compile(r"\w+|[^\w\s]")


class TokenCounter(Protocol):
    exact: bool
    source: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def count(self, text: str) -> int: ...


MAX_TOKENIZER_BYTES = 512 * 2**20
"""Largest tokenizer.json read (the biggest vocabularies' files are tens of MB)."""


class TokenizerError(UserError):
    """A tokenizer that cannot be used: the named file is missing, unreadable or not a
    tokenizer.json that loads. An explicit ``workload.tokenizer`` like that refuses the run,
    never silently replaced by another counter (its lengths would mean something else)."""


class HfTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local tokenizer.json."""

    exact = True

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        # Read as a regular file first: a named pipe called tokenizer.json would block forever.
        text = read_user_text(path, "tokenizer.json", TokenizerError, max_bytes=MAX_TOKENIZER_BYTES)
        try:
            self._tok = Tokenizer.from_str(text)
        except Exception as exc:  # the Rust side raises its own exception types
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise TokenizerError(f"{path}: not a tokenizer.json that loads: {reason}") from None
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


def _tokenizer_file_of(candidate: str) -> Path | None:
    """The tokenizer.json a path, model folder or hub id (in the local cache) stands for."""
    path = Path(candidate).expanduser()
    try:
        if path.is_file() and path.name.endswith(".json"):
            return path
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        for snapshot in _hf_cache_candidates(candidate):
            if (snapshot / "tokenizer.json").is_file():
                return snapshot / "tokenizer.json"
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return None
    return None


def find_tokenizer_file(*candidates: str | None) -> Path | None:
    """The first tokenizer.json found among paths, model folders and hub ids (local only)."""
    for candidate in candidates:
        path = _tokenizer_file_of(candidate) if candidate else None
        if path is not None:
            return path
    return None


def named_tokenizer(name: str | None) -> HfTokenizer | None:
    """The tokenizer the user named (``workload.tokenizer``: a tokenizer.json, a model folder
    holding one, or a hub id in the local Hugging Face cache); None when none is named. Anything
    else raises TokenizerError naming the file and why: checked before a run starts anything."""
    if not name:
        return None
    path = Path(name).expanduser()
    try:
        is_dir, exists = path.is_dir(), path.exists() or path.is_symlink()
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"workload.tokenizer: {name}: not a usable path: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    if is_dir:
        path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"workload.tokenizer: {path.parent}: the folder has no tokenizer.json")
    elif not exists:
        found = _tokenizer_file_of(name)  # a hub id, when its snapshot is in the local cache
        if found is None:
            raise TokenizerError(f"workload.tokenizer: {path}: no such file or folder (nor a model with a "
                                 f"tokenizer.json in the local Hugging Face cache)")
        path = found
    try:
        return HfTokenizer(path)
    except TokenizerError as exc:  # its message names the file and the reason
        raise TokenizerError(f"workload.tokenizer: {exc}") from None


def choose_token_counter(*candidates: str | None) -> tuple[TokenCounter, str]:
    """The first tokenizer that loads among paths, model folders and hub ids (local only), else
    the approximate counter; with a line for the run's notes saying which and why."""
    broken: list[str] = []
    for candidate in candidates:
        path = _tokenizer_file_of(candidate) if candidate else None
        if path is None:
            continue
        try:
            return HfTokenizer(path), f"prompt lengths in the model's tokens: tokenizer {path} (found from {candidate})"
        except TokenizerError as exc:  # a broken or foreign tokenizer.json: try the next, then approximate
            broken.append(str(exc))
    looked = ", ".join(dict.fromkeys(c for c in candidates if c)) or "no model named"
    why = "; ".join(broken) if broken else f"no tokenizer.json on this machine for {looked}"
    return ApproxTokenizer(), (f"prompt lengths are approximate (1 token per word or punctuation mark): {why}; "
                               f"set workload.tokenizer to a tokenizer.json for exact lengths")


def load_token_counter(*candidates: str | None) -> TokenCounter:
    """An exact tokenizer when one is found locally, else the approximate one."""
    return choose_token_counter(*candidates)[0]
