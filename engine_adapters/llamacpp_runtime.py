"""The llama.cpp runtime's files in the user cache: the GGUF demo model, converted from the same
tiny demo model vLLM serves (``runtimes.ensure_demo_model``), so both engines run the same
weights and tokenizer and their runs compare.

The conversion (``llamacpp_gguf.py``) runs with the llama.cpp runtime's interpreter, which has
``gguf``; it takes well under a second, so a launch makes the file when it is missing. The file
is cached under a name that carries the demo model's version and the converter's, like the demo
model itself, and is written to a staging name first, so a torn conversion is never used.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

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
