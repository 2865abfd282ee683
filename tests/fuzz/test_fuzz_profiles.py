"""Profiles as a hostile user writes them: the shipped profiles with random edits (huge, negative,
non-finite, wrongly typed, deeply nested values, unknown keys), random text, nesting thousands
deep, and files that are not regular files. Every one is either a valid configuration that the
rest of tunebench can use, or one line saying what is wrong (exit 2); never a traceback or a hang."""

from __future__ import annotations

import math
import os
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import RunConfig
from app.load.datasets import DatasetError, build_dataset
from app.load.patterns import plan_levels
from app.load.tokens import ApproxTokenizer
from app.profiles import ProfileError, profile_from_toml, profile_to_toml, shipped_profiles
from app.workload import MAX_CONCURRENCY, MAX_LEVEL_PROMPT_TOKENS, MAX_REQUESTS, MAX_TOKENS
from tests.fuzz.hostile import cli, cli_within, hostile_text, mutated_profile

SHIPPED = {name: tomllib.loads(path.read_text()) for name, path in sorted(shipped_profiles().items())}
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


def _numbers(obj: Any) -> list[float]:
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    return [obj] if isinstance(obj, int | float) and not isinstance(obj, bool) else []


def assert_usable(config: RunConfig) -> None:
    """What an accepted profile guarantees the rest of tunebench (the bounds the bad-input runs set)."""
    assert all(math.isfinite(n) for n in _numbers(config.model_dump(mode="python")))
    w, load = config.workload, config.load
    assert 0 <= w.seed < 2**63 and 1 <= w.num_requests <= MAX_REQUESTS
    assert max(w.input_len.mean, w.output_len.mean, w.shared_prefix_tokens) <= MAX_TOKENS
    assert w.num_requests * w.turns * w.input_len.mean <= MAX_LEVEL_PROMPT_TOKENS or w.kind != "multi_turn"
    assert load.concurrency <= MAX_CONCURRENCY
    assert config.engine.startup_timeout_s < math.inf
    assert type(config.load.concurrency) is int and type(config.features.prefix_caching) in (bool, type(None))
    plans = plan_levels(load)
    assert 1 <= len(plans) <= 1_000
    assert profile_from_toml(profile_to_toml(config)) == config  # what is saved loads back the same


def _check_text(text: str) -> None:
    try:
        config = profile_from_toml(text, "fuzz.toml")
    except ProfileError as exc:
        assert str(exc).startswith("fuzz.toml: ")
        assert "\n" not in str(exc)
        return
    assert_usable(config)


@pytest.mark.parametrize("name", sorted(SHIPPED))
@given(data=st.data())
@FUZZ
def test_mutated_shipped_profiles_are_usable_or_refused_in_one_line(name: str, data: st.DataObject,
                                                                    tmp_path: Path) -> None:
    mutated = data.draw(mutated_profile(SHIPPED[name]))
    try:
        text = tomli_w.dumps(mutated)
    except (TypeError, ValueError, RecursionError):
        return  # not expressible as TOML: no user can write it
    _check_text(text)
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    cli("profile", "check", str(path), "--no-discover").check()


@given(text=hostile_text | st.text(max_size=400), cut=st.integers(0, 2000))
@settings(FUZZ, max_examples=300)  # no command line: cheap
def test_random_and_truncated_text_is_refused_in_one_line(text: str, cut: int) -> None:
    shipped = tomli_w.dumps(SHIPPED["cpu-demo"])
    _check_text(text)
    _check_text(shipped[:cut] + text + shipped[cut:])
    _check_text(shipped[:cut])


# The bad-input run's cases, by name: each was accepted or crashed before.
REFUSED = {
    "seed -1": ("[workload]\nseed = -1\n", "workload.seed"),
    "seed 2**64": (f"[workload]\nseed = {2**64 - 1}\n", "workload.seed"),
    "num_requests 10**30": ("[workload]\nnum_requests = 1" + "0" * 30 + "\n", "workload.num_requests"),
    "num_requests 2**40": (f"[workload]\nnum_requests = {2**40}\n", "workload.num_requests"),
    "input mean 10**9": ("[workload.input_len]\nmean = 1000000000\n", "workload.input_len.mean"),
    "a level of 10**12 prompt tokens": ("[workload]\nnum_requests = 1000000\n[workload.input_len]\nmean = 1000000\n",
                                        "prompt tokens per level"),
    "concurrency 2**63-1": (f"[load]\nconcurrency = {2**63 - 1}\n", "load.concurrency"),
    "concurrency as text": ('[load]\nconcurrency = "2"\n', "load.concurrency"),
    "concurrency as bool": ("[load]\nconcurrency = true\n", "load.concurrency"),
    "prefix_caching yes": ('[features]\nprefix_caching = "yes"\n', "features.prefix_caching"),
    "levels nan": ('[load]\npattern = "sweep"\nsweep_of = "rate"\nlevels = [nan]\n', "load.levels"),
    "levels inf": ('[load]\npattern = "sweep"\nlevels = [inf]\n', "load.levels"),
    "rate inf": ('[load]\npattern = "poisson"\nrate_rps = inf\n', "load.rate_rps"),
    "startup timeout inf": ("[engine]\nstartup_timeout_s = inf\n", "engine.startup_timeout_s"),
    "duration nan": ("[load]\nduration_s = nan\n", "load.duration_s"),
    "temperature inf": ("[workload]\ntemperature = inf\n", "workload.temperature"),
    "offload inf": ("[features]\ncpu_offload_gib = inf\n", "features.cpu_offload_gib"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_absurd_values_are_refused_naming_the_field(case: str) -> None:
    text, where = REFUSED[case]
    with pytest.raises(ProfileError) as info:
        profile_from_toml(text, "p.toml")
    assert where in str(info.value) and "\n" not in str(info.value)


def test_real_sizes_stay_admitted() -> None:
    """A million requests, a million-token context, 10,000 streams: real uses, not typos."""
    big = profile_from_toml("[workload]\nnum_requests = 1000000\nseed = 9223372036854775807\n"
                            "[workload.input_len]\nmean = 1000\n[load]\nconcurrency = 10000\n")
    assert big.workload.num_requests == 1_000_000 and big.load.concurrency == 10_000
    long = profile_from_toml("[workload]\nkind = \"long_context\"\nnum_requests = 100\n"
                             "[workload.input_len]\nmean = 1000000\n[features]\nmax_model_len = 1048576\n")
    assert long.workload.input_len.mean == 1_000_000
    floats = profile_from_toml('[load]\npattern = "poisson"\nrate_rps = 4\nduration_s = 60\n')  # ints for floats
    assert floats.load.rate_rps == 4.0


@pytest.mark.parametrize("text", [
    "name = " + "[" * 5000 + "]" * 5000,
    "a = " + "{b = " * 3000 + "1" + "}" * 3000,
    "[" + ".".join(["t"] * 3000) + "]\nx = 1\n",
])
def test_nesting_thousands_deep_is_one_line(text: str, tmp_path: Path) -> None:
    _check_text(text)
    path = tmp_path / "deep.toml"
    path.write_text(text)
    outcome = cli("profile", "check", str(path), "--no-discover").check(allowed=(2,))
    assert str(path) in outcome.err


def test_special_files_and_bad_paths_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)  # nobody writes: reading it would block forever
    cases = {str(fifo): "named pipe", str(tmp_path): "directory", "/dev/zero": "device",
             str(tmp_path / ("x" * 300 + ".toml")): "too long", "": "empty",
             str(tmp_path / "missing.toml"): "no such profile", "a\x00b.toml": "a\\x00b.toml: no such profile"}
    for target, expected in cases.items():
        for command in (("profile", "check"), ("engine", "flags"), ("run",)):
            outcome = cli_within(30, *command, target).check(allowed=(2,))
            assert expected in outcome.err, outcome


def test_an_oversized_profile_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as handle:
        handle.truncate(65 * 2**20)  # sparse: no disk used
    outcome = cli_within(30, "profile", "check", str(big), "--no-discover").check(allowed=(2,))
    assert "at most" in outcome.err


@pytest.mark.parametrize("kind", ["sharegpt", "jsonl"])
def test_a_dataset_that_is_a_named_pipe_is_refused_without_blocking(kind: str, tmp_path: Path) -> None:
    """A run whose dataset_path is a pipe nobody writes would wait forever for its prompts."""
    fifo = tmp_path / "prompts.json"
    os.mkfifo(fifo)
    workload = profile_from_toml(f'[workload]\nkind = "{kind}"\ndataset_path = "{fifo}"\n').workload
    box: dict[str, BaseException] = {}

    def build() -> None:
        try:
            build_dataset(workload, ApproxTokenizer())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "reading the dataset blocked on a named pipe"
    assert isinstance(box.get("error"), DatasetError) and "named pipe" in str(box["error"])


@pytest.mark.parametrize("kind", ["sharegpt", "jsonl"])
def test_a_dataset_nested_a_hundred_thousand_deep_is_one_line(kind: str, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    workload = profile_from_toml(f'[workload]\nkind = "{kind}"\ndataset_path = "{deep}"\n').workload
    with pytest.raises(DatasetError) as info:
        build_dataset(workload, ApproxTokenizer())
    assert "nested too deeply" in str(info.value) and "\n" not in str(info.value)
