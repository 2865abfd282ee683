"""Cold by default: every level's requests carry a salt of their own (shared within the level,
never across levels, warm-up or runs); warm on purpose primes each level with its own prompts
and salt; an endpoint that refuses the salt is run without it, and the notes say so."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from aiohttp import web

from app.bus import Bus
from app.config import RunConfig
from app.load.cache import CachePlan, new_salt, salt_support
from app.load.client import ClientOptions, build_payload
from app.load.datasets import Conversation, Turn
from app.runner import Runner, RunResult
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer


class RecordingServer(FakeOpenAIServer):
    """The fake OpenAI server, keeping every request body; ``refuse_salt`` answers 400 to a
    ``cache_salt`` the way a strict OpenAI-compatible server answers an unknown field."""

    def __init__(self, refuse_salt: bool = False) -> None:
        super().__init__(FakeBehaviour(api_key="k"))
        self.refuse_salt = refuse_salt
        self.bodies: list[dict] = []  # type: ignore[type-arg]

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.refuse_salt and "cache_salt" in body:
            return web.json_response({"error": {"message": "Extra inputs are not permitted: cache_salt"}}, status=400)
        return await super()._complete(request)  # aiohttp keeps the body: the parent reads it again


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    with RecordingServer() as srv:
        yield srv


@pytest.fixture
def strict_server() -> Iterator[RecordingServer]:
    with RecordingServer(refuse_salt=True) as srv:
        yield srv


def run(server: RecordingServer, workload: WorkloadConfig, load: LoadConfig) -> RunResult:
    config = RunConfig(name="cache", workload=workload, load=load)
    result = Runner(config, Bus(), endpoint=server.base_url, api_key="k", telemetry=False).run()
    assert result.status == "completed", result.reason
    return result


WORKLOAD = WorkloadConfig(num_requests=5, input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=4))


def measured(server: RecordingServer) -> list[dict]:  # type: ignore[type-arg]
    """Level requests (not the salt probe, which asks for one token of a fixed prompt)."""
    return [b for b in server.bodies if b.get("prompt") != "cache salt probe"]


def test_payload_carries_the_salt_only_when_set() -> None:
    conv = Conversation(0, [Turn("hello", 4, 1)])
    opts = ClientOptions(base_url="http://x", model="m")
    assert "cache_salt" not in build_payload(opts, conv, 0, [])
    salted = ClientOptions(base_url="http://x", model="m", api="chat", cache_salt="s1")
    assert build_payload(salted, conv, 0, [])["cache_salt"] == "s1"


def test_salts_are_fresh_and_valid_for_vllm() -> None:
    salts = {new_salt() for _ in range(100)}
    assert len(salts) == 100
    # vLLM 0.32 refuses salts over 128 characters or with '@', '/', '\' or NUL
    assert all(0 < len(s) <= 128 and not re.search(r"[@/\\\x00]", s) for s in salts)


@pytest.mark.parametrize(("kind", "version", "takes_salt"), [
    ("vllm", "0.32.0", True), ("vllm", "0.9.0", True), ("vllm", None, True), ("vllm", "0.8.5", False),
    ("sglang", "0.5.0", False), ("llamacpp", None, False),
])
def test_which_engines_take_a_salt(kind: str, version: str | None, takes_salt: bool) -> None:
    reason = salt_support(kind, version)
    assert (reason is None) is takes_salt, reason


def test_each_level_has_its_own_salt_shared_by_its_requests(server: RecordingServer) -> None:
    result = run(server, WORKLOAD, LoadConfig(pattern="sweep", levels=[1, 2], warmup_requests=2))
    bodies = measured(server)
    assert len(bodies) == 2 + 5 + 5  # warm-up, then two levels
    warmup, first, second = bodies[:2], bodies[2:7], bodies[7:]
    salts = [{b.get("cache_salt") for b in group} for group in (warmup, first, second)]
    assert all(len(s) == 1 and None not in s for s in salts), salts  # one salt per group, always sent
    assert len(set.union(*salts)) == 3, salts  # and no two groups share one
    assert any("prefix cache: cold" in n for n in result.notes), result.notes

    again = len(server.bodies)
    run(server, WORKLOAD, LoadConfig(concurrency=2))  # the same seeded prompts once more...
    rerun = measured(server)[len(bodies):]
    assert len(server.bodies) > again  # (two in flight: they may reach the server in either order)
    assert sorted(b["prompt"] for b in rerun) == sorted(b["prompt"] for b in first)
    assert {b["cache_salt"] for b in rerun}.isdisjoint(set.union(*salts))  # ...under a salt never used before


def test_shared_prefix_requests_of_a_level_share_prefix_and_salt(server: RecordingServer) -> None:
    workload = WorkloadConfig(kind="shared_prefix", num_requests=6, shared_prefix_tokens=64,
                              input_len=LengthSpec(mean=8), output_len=LengthSpec(mean=2))
    run(server, workload, LoadConfig(concurrency=3))
    bodies = measured(server)
    prefixes = {b["prompt"].split("\n\n")[0] for b in bodies}
    assert len(bodies) == 6 and len(prefixes) == 1 and len({b["cache_salt"] for b in bodies}) == 1


def test_warm_mode_primes_each_level_with_its_prompts_and_salt(server: RecordingServer) -> None:
    workload = WORKLOAD.model_copy(update={"cache": "warm"})
    result = run(server, workload, LoadConfig(pattern="sweep", levels=[1, 2]))
    bodies = measured(server)
    assert len(bodies) == 4 * 5  # per level: 5 priming requests, then the 5 measured ones
    for level, start in enumerate((0, 10)):
        priming, level_bodies = bodies[start:start + 5], bodies[start + 5:start + 10]
        assert sorted(b["prompt"] for b in priming) == sorted(b["prompt"] for b in level_bodies)
        assert all(b["max_tokens"] == 1 for b in priming) and all(b["max_tokens"] == 4 for b in level_bodies)
        assert len({b["cache_salt"] for b in priming + level_bodies}) == 1, level
        assert result.levels[level].summary.completed == 5  # priming is not measured
    assert bodies[0]["cache_salt"] != bodies[10]["cache_salt"]
    assert any("warm (primed)" in n for n in result.notes), result.notes
    assert sum("primed with 5 unmeasured requests" in n for n in result.notes) == 2


def test_an_endpoint_that_refuses_the_salt_runs_without_it_and_says_so(strict_server: RecordingServer) -> None:
    result = run(strict_server, WORKLOAD, LoadConfig(concurrency=2))
    level = [b for b in strict_server.bodies if b.get("prompt") != "cache salt probe"]
    assert len(level) == 5 and all("cache_salt" not in b for b in level)
    assert result.levels[0].summary.errors == 0
    note = next(n for n in result.notes if n.startswith("prefix cache:"))
    assert "cold not guaranteed" in note and "refused the cache_salt field (HTTP 400" in note, note


def test_the_probe_keeps_the_salt_when_the_endpoint_fails_for_another_reason() -> None:
    opts = ClientOptions(base_url="http://127.0.0.1:9", model="m")  # nothing listens on port 9
    plan = CachePlan.for_run("cold", "vllm", None, opts, attached=True)
    assert plan.salted and plan.label == "cold"
    assert json.dumps(plan.notes()).count("fresh cache salt") == 1
