"""Hostile traces: whatever a trace file holds, reading it gives a trace or one line naming the
file and (for a bad line) its number, never a traceback; and a trace that reads builds prompts
of exactly the lengths it asks for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.config import RunConfig
from app.load.datasets import trace_dataset, workload_trace
from app.load.tokens import ApproxTokenizer
from app.load.traces import TraceError, check_replay, read_trace
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

REPO = Path(__file__).resolve().parents[2]

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers(-10, 3000) | st.floats(allow_nan=True) | st.text(max_size=8)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=4), max_leaves=8)
mooncake_keys = st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"])
near_mooncake = st.dictionaries(mooncake_keys, values | st.integers(0, 3000) | st.lists(st.integers(0, 5), max_size=7),
                                min_size=2, max_size=4)
own_keys = st.sampled_from(["at_s", "input_tokens", "output_tokens", "blocks", "extra"])
near_own = st.dictionaries(own_keys, values | st.integers(0, 3000) | st.lists(st.integers(0, 5), max_size=7),
                           min_size=2, max_size=4)
json_line = (near_mooncake | near_own | values).map(lambda v: json.dumps(v))
csv_line = st.lists(st.text(alphabet="0123456789-:. ,\"abc", max_size=12), min_size=1, max_size=4).map(",".join)

@st.composite
def valid_request(draw: st.DrawFn, fmt: str) -> str:
    tokens = draw(st.integers(1, 400))
    blocks = draw(st.lists(st.integers(0, 5), max_size=(tokens + 63) // 64))
    out, t = draw(st.integers(1, 50)), draw(st.integers(0, 100_000))
    if fmt == "mooncake":
        return json.dumps({"timestamp": t, "input_length": tokens, "output_length": out, "hash_ids": blocks})
    if fmt == "tunebench":
        return json.dumps({"at_s": t / 1e3, "input_tokens": tokens, "output_tokens": out, "blocks": blocks})
    return f"2024-05-{1 + t // 40_000:02d} 10:{t // 1000 % 60:02d}:{t % 60:02d}.{t:07d},{tokens},{out}"


@st.composite
def valid_trace(draw: st.DrawFn) -> str:
    """A trace that reads, sometimes with one line made hostile (which must then be named)."""
    fmt = draw(st.sampled_from(["mooncake", "tunebench", "azure"]))
    lines = draw(st.lists(valid_request(fmt), min_size=1, max_size=6))
    if draw(st.booleans()):
        lines[draw(st.integers(0, len(lines) - 1))] = draw(json_line | csv_line | st.text(max_size=20))
    return "\n".join((["TIMESTAMP,ContextTokens,GeneratedTokens"] if fmt == "azure" else []) + lines)


trace_text = st.one_of(
    valid_trace(),
    st.lists(json_line | st.text(max_size=30), max_size=6).map("\n".join),
    st.lists(csv_line, max_size=6).map(lambda rows: "\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *rows])),
)


@given(text=trace_text, suffix=st.sampled_from([".jsonl", ".csv", ".txt"]))
@FUZZ
def test_any_trace_reads_or_is_refused_in_one_line(tmp_path: Path, text: str, suffix: str) -> None:
    path = tmp_path / f"trace{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        trace = read_trace(path, block_tokens=64)
    except TraceError as exc:
        message = str(exc)
        event("refused: " + re.sub(r"^.*?: (line \d+: )?", "", message)[:25])
        assert "\n" not in message and message.startswith(str(path)), message
        numbered = re.search(r": line (\d+): ", message)
        if numbered:
            assert 1 <= int(numbered.group(1)) <= max(1, text.count("\n") + 1), message
        return
    event(f"read: {trace.format}")
    assert trace.requests and trace.requests[0].at_s == 0.0
    assert all(b.at_s >= a.at_s for a, b in zip(trace.requests, trace.requests[1:], strict=False))
    small = [r for r in trace.requests if r.input_tokens <= 300]
    if small:  # prompts of exactly the asked lengths, in the counter's tokens
        from dataclasses import replace
        counter = ApproxTokenizer()
        dataset = trace_dataset(replace(trace, requests=small), counter, np.random.default_rng(0))
        assert [c.turns[0].input_tokens for c in dataset.conversations] == [r.input_tokens for r in small]


CENTURIES_PROFILE = """name = "centuries"
[workload]
kind = "trace"
dataset_path = "{trace}"
{workload}
[load]
pattern = "trace"
{load}"""


def _centuries_trace(tmp_path: Path) -> Path:
    """Two Mooncake lines 1e15 ms (about 31,700 years) apart."""
    path = tmp_path / "centuries.jsonl"
    path.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 16, "output_length": 2, "hash_ids": []})
                              for t in (0, 10**15)), encoding="utf-8")
    return path


def test_a_trace_that_spans_centuries_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    trace = _centuries_trace(tmp_path)
    profile = tmp_path / "p.toml"
    profile.write_text(CENTURIES_PROFILE.format(trace=trace, workload="", load=""))
    with FakeOpenAIServer(FakeBehaviour()) as server:
        try:  # before the refusal the run waited for the second line: fail, not hang
            done = subprocess.run([sys.executable, "-m", "app.cli", "run", str(profile), "--endpoint", server.base_url,
                                   "--db", str(tmp_path / "runs.db"), "--no-telemetry"], cwd=REPO, timeout=120,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run was still waiting for the trace's last line after 120 s ({server.requests} sent)")
        sent = server.requests
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output, output
    assert sent == 0, output
    refusal = [line for line in output.splitlines() if "longer than any run may last" in line]
    assert len(refusal) == 1, output
    assert refusal[0].startswith(f"run failed: {trace}: line 2: arrives "), refusal
    assert " years (1,000,000,000,000 s) after the first request" in refusal[0], refusal
    assert all(way in refusal[0] for way in ("workload.trace_end_s", "load.speedup", "load.duration_s")), refusal


@pytest.mark.parametrize(("workload", "load"), [
    ("trace_end_s = 60", ""), ("", "speedup = 1000000"), ("", "duration_s = 60"), ("", "max_requests = 1")])
def test_each_way_out_the_refusal_names_replays_it(workload: str, load: str, tmp_path: Path) -> None:
    path = _centuries_trace(tmp_path)

    def check(workload: str, load: str) -> None:
        config = RunConfig.model_validate(tomllib.loads(CENTURIES_PROFILE.format(trace=path, workload=workload,
                                                                                  load=load)))
        check_replay(workload_trace(config.workload), config.load)

    with pytest.raises(TraceError, match="longer than any run may last"):
        check("", "")
    check(workload, load)
