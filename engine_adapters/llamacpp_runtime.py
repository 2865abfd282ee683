"""The llama.cpp runtime's files in the user cache: the GGUF demo model, converted from the same
tiny demo model vLLM serves (``runtimes.ensure_demo_model``), so both engines run the same
weights and tokenizer and their runs compare.

The conversion (``llamacpp_gguf.py``) runs with the llama.cpp runtime's interpreter, which has
``gguf``; it takes well under a second, so a launch makes the file when it is missing. The file
is cached under a name that carries the demo model's version and the converter's, like the demo
model itself, and is written to a staging name first, so a torn conversion is never used.

Weight precision on llama.cpp (``weights_dtype = "q8_0"`` or ``"q4_0"``) is a file too: the 16-bit
GGUF quantized with the same interpreter's ``gguf`` package (``llamacpp_gguf.quantize_file``), a
second or two for the demo model. The demo's quantized files are cached beside its 16-bit GGUF; a
user's GGUF gets them in the user cache, under a name that carries the source's path, size and
modification time (so an edited source is quantized again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine_adapters.config import GGUF_WEIGHT_BITS
from engine_adapters.paths import cache_dir
from engine_adapters.runtimes import (
    COMPLETE_MARKER,
    DEMO_MODEL_VERSION,
    RuntimeErrorMessage,
    demo_model_dir,
)

CONVERTER = Path(__file__).with_name("llamacpp_gguf.py")
GGUF_CONVERTER_VERSION = "1"
"""Bumped when the converter's output changes, so a cached GGUF is made again."""


def gguf_demo_dir() -> Path:
    return demo_model_dir().with_name(f"tunebench-demo-llama-v{DEMO_MODEL_VERSION}-gguf{GGUF_CONVERTER_VERSION}")


def gguf_demo_path() -> Path:
    return gguf_demo_dir() / "model-bf16.gguf"


def gguf_demo_ready() -> bool:
    return (gguf_demo_dir() / COMPLETE_MARKER).is_file() and gguf_demo_path().is_file()


def ensure_gguf_demo_model(python: str | None, log: Callable[[str], None] | None = None) -> Path:
    """The demo model as GGUF, converted with ``python`` (an interpreter that has ``gguf``) when
    it is not cached yet."""
    if gguf_demo_ready():
        return gguf_demo_path()
    source = demo_model_dir()
    if not (source / COMPLETE_MARKER).is_file():
        raise RuntimeErrorMessage("the demo model is not generated yet: run `tunebench demo-model`")
    if python is None:
        raise RuntimeErrorMessage("the demo model has no GGUF yet and this runtime has no Python to convert it: "
                                  "run it once with the llamacpp-cpu runtime (`tunebench engine install llamacpp-cpu`)")
    target = gguf_demo_dir()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if log:
        log(f"converting the demo model to GGUF in {target}")
    out = staging / gguf_demo_path().name
    result = subprocess.run([python, str(CONVERTER), str(source), str(out)], capture_output=True, text=True,
                            check=False, timeout=300)
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise RuntimeErrorMessage(f"converting the demo model to GGUF failed: {tail}")
    info = json.loads(result.stdout.strip().splitlines()[-1])
    info.pop("path", None)  # the staging name
    info["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    (staging / COMPLETE_MARKER).write_text(json.dumps(info))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return gguf_demo_path()


def quantized_gguf_path(source: Path, weights_dtype: str) -> Path:
    """Where the ``weights_dtype`` file made from ``source`` is cached: beside the demo's 16-bit
    GGUF, or in the user cache for any other file (named after its path, size and mtime)."""
    if weights_dtype not in GGUF_WEIGHT_BITS:
        raise ValueError(f"{weights_dtype} is not a GGUF weight type ({', '.join(GGUF_WEIGHT_BITS)})")
    if source == gguf_demo_path():
        return gguf_demo_dir() / f"model-{weights_dtype}.gguf"
    stat = source.stat()
    identity = f"{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir() / "models" / "quantized" / f"{source.stem}-{digest}" / f"{source.stem}-{weights_dtype}.gguf"


def ensure_quantized_gguf(source: Path, weights_dtype: str, python: str | None,
                          log: Callable[[str], None] | None = None) -> Path:
    """``source`` (a 16-bit GGUF) with its weights in ``weights_dtype``, quantized with ``python``
    (an interpreter that has ``gguf``) when it is not cached yet. Written under a temporary name
    and renamed, so a torn or concurrent quantization never leaves a partial file in its place."""
    if not source.is_file():
        raise RuntimeErrorMessage(f"model file not found: {source}")
    target = quantized_gguf_path(source, weights_dtype)
    if target.is_file():
        return target
    if python is None:
        raise RuntimeErrorMessage(f"weights_dtype {weights_dtype} makes a quantized GGUF with the gguf package: run it "
                                  "once with the llamacpp-cpu runtime (`tunebench engine install llamacpp-cpu`), or "
                                  "pass a GGUF quantized the way you want and leave weights_dtype on auto")
    target.parent.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"quantizing {source.name} to {weights_dtype} in {target.parent}")
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".partial")
    os.close(fd)
    try:
        result = subprocess.run([python, str(CONVERTER), "--quantize", str(source), partial, weights_dtype],
                                capture_output=True, text=True, check=False, timeout=600)
        if result.returncode != 0:
            tail = " | ".join(result.stderr.strip().splitlines()[-3:])
            raise RuntimeErrorMessage(f"quantizing {source.name} to {weights_dtype} failed: {tail}")
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return target
