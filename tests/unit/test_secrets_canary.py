"""Canaries: one distinct secret planted in every place a user can put one (profile environment,
``extra_args``, the endpoint URL, ``--api-key``, an imported file, what a server or an engine
prints), then every way out of tunebench grepped for all of them: what each command printed
(runs, error messages, ``runs show``, ``runs list``, ``compare``), the ``--json`` results, every
export format (of runs and of profiles), the raw database files (and WAL), its blobs
decompressed and what its readers return. Plus the engine log as the launcher reads it, and the
migration that masks databases written by older versions. No real engine is needed: runs attach
to the fake OpenAI server, or launch a fake ``vllm`` executable that serves it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from app.cli import main
from app.store import RunStore, create_at_revision
from engine_adapters import secrets as sec
from engine_adapters.config import EngineConfig, Features
from engine_adapters.launcher import EngineProcess
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

SCRIPT_FORMATS = ("bash", "docker", "compose", "k8s")
EXPORT_FORMATS = ("json", "csv", "html", *SCRIPT_FORMATS)


def _canary(place: str) -> str:
    """A value found nowhere else (no rule can match it by accident: it is its own word)."""
    return f"CANARY{place}{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def _fresh_memory() -> Iterator[None]:
    """Values masked by an earlier test must not help this one (each run proves the rules)."""
    sec.forget_secrets()
    yield
    sec.forget_secrets()


def _db_texts(path: Path, *, read_store: bool = True) -> dict[str, bytes]:
    """The database as an attacker could read it: the files' bytes, every BLOB that decompresses
    (log and request chunks are compressed, so their raw bytes hide nothing), and what the
    store's readers return for each run."""
    out = {p.name: p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file()}
    with contextlib.closing(sqlite3.connect(path)) as conn:  # closed: an open reader would keep the WAL alive
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608
                for value in row:
                    if isinstance(value, bytes):
                        try:
                            out.setdefault(f"{table} blobs (decompressed)", b"")
                            out[f"{table} blobs (decompressed)"] += zlib.decompress(value) + b"\n"
                        except zlib.error:
                            pass
    if not read_store:  # opening it would migrate it
        return out
    with RunStore(path) as store:
        for run in store.list_runs():
            out[f"run {run.id} as the store reads it"] = json.dumps({
                "run": store.get_run(run.id).model_dump(mode="json"), "log": store.log_lines(run.id),
                "requests": store.request_records(run.id)}, default=str).encode()
    return out


def _leaks(outputs: dict[str, bytes | str], canaries: dict[str, str]) -> list[str]:
    found = []
    for where, data in outputs.items():
        raw = data if isinstance(data, bytes) else data.encode()
        for place, value in canaries.items():
            if value.encode() in raw:
                found.append(f"{place} in {where}")
    return found


_ENV_NAMES = ("HF_TOKEN", "MY_PASSWORD", "OPENAI_API_KEY", "X_AUTH", "SOME_CREDENTIAL")
_REPO = Path(__file__).resolve().parents[2]


def _profile(path: Path, env: dict[str, str], extra_args: list[str], executable: Path) -> Path:
    """A profile whose vLLM is ``executable`` (launch scripts need an engine that is installed)."""
    env_toml = ", ".join(f'{name} = "{value}"' for name, value in env.items())
    path.write_text(f"""name = "{path.stem}"
[engine]
kind = "vllm"
model = "fake/model"
startup_timeout_s = 120
[engine.runtime]
kind = "executable"
executable = "{executable}"
env = {{ {env_toml} }}
[features]
extra_args = {json.dumps(extra_args)}
[workload]
kind = "random"
num_requests = 6
[workload.input_len]
mean = 8
[workload.output_len]
mean = 4
[load]
pattern = "closed"
concurrency = 2
""", encoding="utf-8")
    return path


def _fake_engine(path: Path, bearer: str) -> Path:
    """A stand-in for ``vllm``: answers ``--version`` and ``serve --help`` like vLLM 0.32 (CPU),
    and ``serve`` logs what vLLM logs (its parsed arguments, here with the ``--hf-token`` values),
    echoes its environment and a request header with a bearer token, then serves the fake API."""
    path.write_text(f"""#!{sys.executable}
import os, sys, time
sys.path.insert(0, {str(_REPO)!r})
args = sys.argv[1:]
if args == ["--version"]:
    print("0.32.0+cpu")
    sys.exit(0)
if "--help" in args:
    print(open({str(_REPO / "tests/data/vllm-0.32.0-help.txt")!r}).read())
    sys.exit(0)
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
tokens = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--hf-token"]
tokens += [a.split("=", 1)[1] for a in args if a.startswith("--hf-token=")]
print("INFO non-default args: " + repr({{"model_tag": args[1], "hf_token": tokens, "port": port}}), flush=True)
print("DEBUG environment: " + " ".join(f"{{k}}={{os.environ.get(k)}}" for k in {_ENV_NAMES!r}), flush=True)
print("DEBUG request headers: Authorization: Bearer {bearer}", flush=True)
FakeOpenAIServer(FakeBehaviour(api_key=os.environ.get("VLLM_API_KEY")), host, port).start()
print(f"INFO Starting vLLM API server on http://{{host}}:{{port}}", flush=True)
while True:
    time.sleep(1)
""", encoding="utf-8")
    path.chmod(0o755)
    return path


def _tunebench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse refusing an argument
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_no_canary_leaves_tunebench(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_CACHE_DIR", str(tmp_path / "cache"))  # the fake engine's flag cache
    places = [*(f"attached {n}" for n in _ENV_NAMES), "attached extra --api-key X", "attached extra --api-key=Y",
              "attached extra --hf-token X", "endpoint user:password@", "--api-key option", "server error Bearer",
              *(f"launched {n}" for n in _ENV_NAMES), "launched extra --hf-token X", "launched extra --hf-token=Y",
              "engine log Bearer", "error: run --endpoint", "error: monitor --endpoint", "import config HF_TOKEN",
              "import argv --api-key", "import log Bearer", "import request error"]
    canaries = {place: _canary(str(i)) for i, place in enumerate(places)}
    engine = _fake_engine(tmp_path / "fake-vllm", canaries["engine log Bearer"])
    attached = _profile(tmp_path / "attached.toml", {n: canaries[f"attached {n}"] for n in _ENV_NAMES}, [
        "--api-key", canaries["attached extra --api-key X"], f"--api-key={canaries['attached extra --api-key=Y']}",
        "--hf-token", canaries["attached extra --hf-token X"]], engine)  # (the engine only for launch scripts)
    launched = _profile(tmp_path / "launched.toml", {n: canaries[f"launched {n}"] for n in _ENV_NAMES}, [
        "--hf-token", canaries["launched extra --hf-token X"], f"--hf-token={canaries['launched extra --hf-token=Y']}"],
        engine)
    db = tmp_path / "runs.db"
    outputs: dict[str, bytes | str] = {}

    # Run 1: the endpoint's URL carries a password (the fake server ignores it).
    with FakeOpenAIServer() as server:
        url = f"http://user:{canaries['endpoint user:password@']}@127.0.0.1:{server.port}"
        rc, outputs["run 1 (attached) printed"] = _tunebench(
            capsys, "run", str(attached), "--endpoint", url, "--db", str(db), "--json", str(tmp_path / "run1.json"),
            "--no-telemetry", "--verbose")
        assert server.requests > 0, outputs["run 1 (attached) printed"]
    # Run 2: --api-key, and a server that echoes it and a bearer token in its errors.
    key = canaries["--api-key option"]
    server = FakeOpenAIServer(FakeBehaviour(api_key=key))

    async def echo_500(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": f"upstream refused Authorization: Bearer "
                                                       f"{canaries['server error Bearer']} ({key})"}}, status=500)

    server._complete = echo_500  # type: ignore[method-assign]
    with server:
        rc, outputs["run 2 (attached, --api-key) printed"] = _tunebench(
            capsys, "run", str(attached), "--endpoint", server.base_url, "--api-key", key, "--db", str(db),
            "--json", str(tmp_path / "run2.json"), "--no-telemetry", "--verbose")
    # Run 3: tunebench launches the engine (argv, environment and log are the engine's).
    rc, outputs["run 3 (launched) printed"] = _tunebench(
        capsys, "run", str(launched), "--db", str(db), "--json", str(tmp_path / "run3.json"), "--no-telemetry",
        "--verbose")
    assert rc == 0, outputs["run 3 (launched) printed"]
    for i in (1, 2, 3):
        outputs[f"--json run{i}.json"] = (tmp_path / f"run{i}.json").read_bytes()
    # Error messages that quote the URL they refuse.
    for command, flag in (("run", "error: run --endpoint"), ("monitor", "error: monitor --endpoint")):
        bad = f"ftp://user:{canaries[flag]}@127.0.0.1:1"
        args = ("run", str(attached), "--endpoint", bad, "--db", str(db)) if command == "run" else (
            "monitor", "--endpoint", bad, "--duration", "0.1")
        rc, outputs[flag] = _tunebench(capsys, *args)
        assert rc == 2, outputs[flag]
    # An import: a tunebench export written elsewhere (by an older version) with secrets in it.
    doc_path = tmp_path / "to-import.json"
    rc, printed = _tunebench(capsys, "export", "1", "--format", "json", "-o", str(doc_path), "--db", str(db))
    assert rc == 0, printed
    doc = json.loads(doc_path.read_text())
    doc["run"]["config"]["engine"]["runtime"]["env"]["HF_TOKEN"] = canaries["import config HF_TOKEN"]
    doc["run"]["argv"] = ["vllm", "serve", "m", "--api-key", canaries["import argv --api-key"]]
    doc["log"] = [*doc["log"], f"DEBUG Authorization: Bearer {canaries['import log Bearer']}"]
    doc["requests"][0]["error"] = f"cannot connect to http://u:{canaries['import request error']}@h:1"
    doc_path.write_text(json.dumps(doc))
    rc, outputs["import printed"] = _tunebench(capsys, "import", str(doc_path), "--db", str(db))
    assert rc == 0, outputs["import printed"]

    with RunStore(db) as store:
        runs = sorted(store.list_runs(), key=lambda r: r.id)
        assert len(runs) == 4
        run_ids = [str(r.id) for r in runs]
        imported = {str(r.id) for r in runs if r.imported}
        # The plants really got there, masked: a check that passes on nothing recorded proves nothing.
        first, third = store.get_run(runs[0].id), store.get_run(runs[2].id)
        assert first.config["engine"]["runtime"]["env"]["HF_TOKEN"] == sec.MASK
        assert first.endpoint is not None and f"user:{sec.MASK}@" in first.endpoint
        assert any(r["error"] and "Bearer ***" in r["error"] for r in store.request_records(runs[1].id))
        assert third.argv is not None and f"--hf-token={sec.MASK}" in third.argv
        assert any("Authorization: Bearer ***" in line for line in store.log_lines(runs[2].id))
        assert store.get_run(runs[3].id).config["engine"]["runtime"]["env"]["HF_TOKEN"] == sec.MASK

    for run_id in run_ids:
        for args in (("runs", "show", run_id, "--log"), ("runs", "show", run_id, "--json", "--log")):
            rc, printed = _tunebench(capsys, *args, "--db", str(db))
            assert rc == 0, printed
            outputs[" ".join(args)] = printed
        for fmt in EXPORT_FORMATS:
            out = tmp_path / f"export-{run_id}.{fmt}"
            rc, printed = _tunebench(capsys, "export", run_id, "--format", fmt, "-o", str(out), "--db", str(db))
            outputs[f"export {run_id} --format {fmt} (printed)"] = printed
            if run_id in imported and fmt in SCRIPT_FORMATS:  # no engine configuration to launch
                assert rc == 2, printed
                continue
            assert rc == 0, printed
            outputs[f"export {run_id} --format {fmt}"] = out.read_bytes()
    for profile in (attached, launched):  # launch scripts straight from the profiles
        for fmt in SCRIPT_FORMATS:
            out = tmp_path / f"export-{profile.stem}.{fmt}"
            rc, printed = _tunebench(capsys, "export", str(profile), "--format", fmt, "-o", str(out))
            assert rc == 0, printed
            outputs[f"export {profile.name} --format {fmt}"] = out.read_bytes()
    rc, outputs["compare"] = _tunebench(capsys, "compare", *run_ids, "--db", str(db))
    rc, outputs["runs list"] = _tunebench(capsys, "runs", "list", "--db", str(db))
    outputs.update({f"database {k}": v for k, v in _db_texts(db).items()})

    assert len(outputs) >= 50, sorted(outputs)
    leaks = _leaks(outputs, canaries)
    assert leaks == [], "\n".join(leaks)


def test_the_engine_log_is_masked_as_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tunebench engine start`` prints the log straight from the launcher, and the diagnosis of a
    failed start reads its copy: both must be masked where the lines come in."""
    monkeypatch.setenv("TUNEBENCH_CACHE_DIR", str(tmp_path / "cache"))
    canaries = {place: _canary(str(i)) for i, place in enumerate(
        ["env HF_TOKEN", "env MY_PASSWORD", "extra --hf-token X", "log Bearer"])}
    engine = EngineConfig.model_validate({
        "model": "fake/model", "runtime": {"kind": "executable", "executable": str(_fake_engine(
            tmp_path / "fake-vllm", canaries["log Bearer"])), "env": {
            "HF_TOKEN": canaries["env HF_TOKEN"], "MY_PASSWORD": canaries["env MY_PASSWORD"]}}})
    seen: list[str] = []
    process = EngineProcess(engine, Features(extra_args=["--hf-token", canaries["extra --hf-token X"]]),
                            on_log=seen.append)
    process.start()
    try:
        process.wait_ready(timeout_s=120)
        kept = process.snapshot_log()
    finally:
        process.stop()
    assert any("Authorization: Bearer ***" in line for line in seen), seen
    assert _leaks({"on_log": "\n".join(seen), "the kept log": "\n".join(kept)}, canaries) == []


def _old_run(path: Path, canaries: dict[str, str]) -> None:
    """A run as versions before 0003 stored it: secrets in plain text everywhere."""
    config = {"name": "old", "description": "long enough to spill into overflow pages " * 300,
              "engine": {"runtime": {"env": {
        "HF_TOKEN": canaries["config HF_TOKEN"], "MY_PASSWORD": canaries["config MY_PASSWORD"],
        "OPENAI_API_KEY": canaries["config OPENAI_API_KEY"], "X_AUTH": canaries["config X_AUTH"],
        "SOME_CREDENTIAL": canaries["config SOME_CREDENTIAL"]}}},
        "features": {"extra_args": ["--api-key", canaries["extra --api-key X"],
                                    f"--api-key={canaries['extra --api-key=Y']}"], "max_num_batched_tokens": 512}}
    argv = ["vllm", "serve", "m", "--api-key", canaries["argv --api-key"], "--max-num-seqs", "4"]
    env = {"VLLM_API_KEY": canaries["env VLLM_API_KEY"], "OMP_NUM_THREADS": "2"}
    log = "\n".join(["INFO starting", f"INFO non-default args: {{'api_key': ['{canaries['log api_key']}']}}",
                     f"DEBUG Authorization: Bearer {canaries['log Bearer']}", "INFO max_tokens=32"])
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO runs (id, uid, name, notes, status, reason, created_at, started_at, engine_kind, model, "
            "endpoint, config, argv, env, hardware, engine_info, summary, metrics, imported, dropped_items) "
            "VALUES (1, 'u1', 'old', '', 'failed', ?, ?, ?, 'vllm', 'm', ?, ?, ?, ?, '{}', ?, '{}', '{}', 0, 0)",
            (f"HTTP 401: Bearer {canaries['reason Bearer']} refused", now, now,
             f"http://user:{canaries['endpoint password']}@127.0.0.1:8000", json.dumps(config), json.dumps(argv),
             json.dumps(env), json.dumps({"base_url": f"http://u:{canaries['engine_info url']}@h:1"})))
        conn.execute("INSERT INTO levels (run_id, idx, label, params) VALUES (1, 0, 'c=1', ?)",
                     (json.dumps({"headers": {"Authorization": f"Bearer {canaries['level header']}"}}),))
        conn.execute("INSERT INTO run_events (run_id, t_wall, kind, payload) VALUES (1, ?, 'log', ?)",
                     (now, json.dumps({"line": f"HF_TOKEN={canaries['event HF_TOKEN']}"})))
        conn.execute("INSERT INTO requests (run_id, seq, level, error) VALUES (1, 0, 0, ?)",
                     (f"cannot connect to http://u:{canaries['request error url']}@h:1",))
        conn.execute("INSERT INTO requests (run_id, seq, level, ttft_ms) VALUES (1, 1, 0, 12.5)")
        conn.execute("INSERT INTO request_chunks (run_id, seq_start, n, counts, \"values\") VALUES (1, 0, 2, ?, ?)",
                     (bytes(8), b""))
        conn.execute("INSERT INTO log_chunks (run_id, seq, n_lines, data) VALUES (1, 0, 4, ?)",
                     (zlib.compress(log.encode()),))


def test_the_migration_masks_secrets_stored_by_older_versions(tmp_path: Path) -> None:
    places = ["config HF_TOKEN", "config MY_PASSWORD", "config OPENAI_API_KEY", "config X_AUTH",
              "config SOME_CREDENTIAL", "extra --api-key X", "extra --api-key=Y", "argv --api-key",
              "env VLLM_API_KEY", "endpoint password", "reason Bearer", "engine_info url", "level header",
              "event HF_TOKEN", "request error url", "log api_key", "log Bearer"]
    canaries = {place: _canary(str(i)) for i, place in enumerate(places)}
    db = tmp_path / "old.db"
    create_at_revision(db, "0002")
    _old_run(db, canaries)
    before = _leaks({f"before: {k}": v for k, v in _db_texts(db, read_store=False).items()}, canaries)
    assert {leak.split(" in ")[0] for leak in before} == set(places)  # all planted, readable

    with RunStore(db) as store:
        assert store.schema_revision() is not None and store.schema_revision() >= "0003"
        run = store.get_run(1)
        assert run.config["engine"]["runtime"]["env"]["HF_TOKEN"] == sec.MASK
        assert run.config["features"]["extra_args"] == ["--api-key", sec.MASK, f"--api-key={sec.MASK}"]
        assert run.config["features"]["max_num_batched_tokens"] == 512
        assert run.argv == ["vllm", "serve", "m", "--api-key", sec.MASK, "--max-num-seqs", "4"]
        assert run.env == {"VLLM_API_KEY": sec.MASK, "OMP_NUM_THREADS": "2"}
        assert run.endpoint == f"http://user:{sec.MASK}@127.0.0.1:8000"
        assert store.log_lines(1)[0] == "INFO starting" and store.log_lines(1)[-1] == "INFO max_tokens=32"
        assert len(store.requests(1)) == 2
    assert _leaks({f"after: {k}": v for k, v in _db_texts(db).items()}, canaries) == []
