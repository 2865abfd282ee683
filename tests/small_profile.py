"""The small profile the CLI tests run against the fake server, written by one helper instead of
its TOML by hand in each test: a name, how many requests, their mean output length, the load."""

from __future__ import annotations

from pathlib import Path

LLAMACPP_DEMO_ENGINE = """
[engine]
kind = "llamacpp"
model = "tunebench:demo"
[engine.runtime]
kind = "managed"
managed = "llamacpp-cpu"
"""
"""A profile's engine tables for the llama.cpp CPU engine and the demo model (the fastest start),
for the tests that write a whole profile of their own."""


def write_small_profile(path: Path, name: str, num_requests: int, output_mean: int, load: str = "") -> Path:
    """``load``: the ``[load]`` table's lines (``concurrency = 2``); none: the profile's default load."""
    path.write_text(f'name = "{name}"\n[workload]\nnum_requests = {num_requests}\n[workload.output_len]\n'
                    f'mean = {output_mean}\n' + (f"[load]\n{load}\n" if load else ""))
    return path
