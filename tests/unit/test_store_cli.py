"""`tunebench runs|compare|export|import` on a store given by --db or TUNEBENCH_DB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.store import RunStore, SampleIn


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cli.db"
    with RunStore(path) as store:
        for name, ttft, prefix in (("prefix off", 60.0, False), ("prefix on", 30.0, True)):
            run_id = store.create_run(name=name, tags=["cpu"], engine_kind="vllm", model="tunebench:demo",
                                      engine_version="0.32.0", t0_mono=0.0, started_at=1.9e9,
                                      config={"name": name, "engine": {"model": "tunebench:demo"},
                                              "features": {"prefix_caching": prefix}})
            store.write_batch(run_id, requests=[{"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": ttft, "e2e_ms": 90.0,
                                                 "output_tokens": 4, "itl_ms": [10.0] * 3} for i in range(4)],
                              samples=[SampleIn("client", float(t), 1.9e9 + t, {"output_tok_per_s": 10.0})
                                       for t in range(3)])
            store.finish_run(run_id, "completed")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_show_compare_json(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", "list", "--db", str(db))
    assert code == 0 and "prefix off" in out and "prefix on" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--db", str(db), "--json", "--name", "off")
    assert [r["name"] for r in json.loads(out)] == ["prefix off"]
    code, out, _ = run_cli(capsys, "runs", "show", "1", "--db", str(db), "--json")
    assert json.loads(out)["n_requests"] == 4
    code, out, _ = run_cli(capsys, "runs", "show", "prefix on", "--db", str(db))
    assert "run 2" in out and "4 requests" in out
    code, out, _ = run_cli(capsys, "compare", "1", "2", "--db", str(db))
    assert code == 0 and "features.prefix_caching" in out and "30.0 (-50% better)" in out
    code, out, _ = run_cli(capsys, "compare", "1", "2", "--baseline", "2", "--db", str(db), "--json")
    data = json.loads(out)
    assert data["baseline_id"] == 2 and data["series"]["items"][0]["name"] == "output_tok_per_s"
    ttft = next(m for m in data["metrics"] if m["name"] == "ttft_ms_p50")
    assert ttft["delta_pct"] == [100.0, 0.0]


def test_environment_names_the_database(db: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_DB", str(db))
    code, out, _ = run_cli(capsys, "runs", "list", "--json")
    assert code == 0 and len(json.loads(out)) == 2


def test_tag_rename_delete(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "runs", "tag", "1", "winner", "--db", str(db))[1].strip() == "run 1: tags cpu, winner"
    assert "tags winner" in run_cli(capsys, "runs", "tag", "1", "cpu", "--remove", "--db", str(db))[1]
    assert run_cli(capsys, "runs", "rename", "1", "baseline", "--notes", "n", "--db", str(db))[0] == 0
    code, out, _ = run_cli(capsys, "runs", "list", "--tag", "winner", "--db", str(db), "--json")
    assert [(r["name"], r["notes"]) for r in json.loads(out)] == [("baseline", "n")]
    code, _, err = run_cli(capsys, "runs", "delete", "1", "99", "--db", str(db))
    assert code == 2 and "no run '99'" in err
    assert len(json.loads(run_cli(capsys, "runs", "list", "--db", str(db), "--json")[1])) == 2  # nothing deleted
    assert run_cli(capsys, "runs", "delete", "1", "--db", str(db))[0] == 0
    assert len(json.loads(run_cli(capsys, "runs", "list", "--db", str(db), "--json")[1])) == 1


def test_exports_and_import(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "launch.sh"
    code, _, err = run_cli(capsys, "export", "2", "--format", "bash", "-o", str(out_file), "--db", str(db))
    assert code == 0 and out_file.stat().st_mode & 0o100 and "--enable-prefix-caching" in out_file.read_text()
    code, out, _ = run_cli(capsys, "export", "cpu-demo", "-f", "k8s", "--db", str(db))
    assert code == 0 and "kind: Deployment" in out
    for fmt in ("json", "csv"):
        assert run_cli(capsys, "export", "1", "-f", fmt, "-o", str(tmp_path / f"r.{fmt}"), "--db", str(db))[0] == 0
    assert run_cli(capsys, "export", "1", "2", "-f", "html", "-o", str(tmp_path / "r.html"), "--db", str(db))[0] == 0
    assert "<svg" in __import__("base64").b64decode(
        (tmp_path / "r.html").read_text().split("base64,")[1].split('"')[0]).decode()
    assert run_cli(capsys, "export", "1", "-f", "html", "-o", str(tmp_path / "one.html"), "--db", str(db))[0] == 0
    code, out, _ = run_cli(capsys, "import", str(tmp_path / "r.json"), "--name", "copy", "--db", str(db))
    assert code == 0 and "as run 3" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--db", str(db))
    assert "completed*" in out and "imported from another tool" in out


@pytest.mark.parametrize("argv, message", [
    (["export", "1", "2", "-f", "bash"], "exports one run or profile"),
    (["export", "cpu-demo", "-f", "csv"], "needs runs; 'cpu-demo' is a profile"),
    (["export", "7", "-f", "json"], "no run '7'"),
    (["export", "nope", "-f", "bash"], "neither a stored run nor a profile"),
    (["compare", "1"], "at least two runs"),
    (["runs", "list", "--since", "yesterday"], "not a date"),
    (["import", "/does/not/exist.json"], "no such file"),
    (["runs", "rename", "1", "  "], "must not be blank"),
])
def test_bad_input_is_one_line(db: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run_cli(capsys, *argv, "--db", str(db))
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unreadable_database_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("garbage" * 1000)
    code, _, err = run_cli(capsys, "runs", "list", "--db", str(bad))
    assert code == 2 and "cannot open the run database" in err and err.count("\n") == 1


def test_show_lists_tunebenchs_notes_apart_from_the_engine_log(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.events import LogLine

    with RunStore(db) as store:
        store.write_batch(1, log_lines=["INFO engine warming up",
                                        LogLine.note("token counts: the engine's own tokenizer").line,
                                        "INFO tunebench: not a note, the engine quoting a name",
                                        LogLine.note("the trace implies 55.4% of prompt tokens from the cache").line])
    code, out, _ = run_cli(capsys, "runs", "show", "1", "--db", str(db))
    assert code == 0
    lines = out.splitlines()
    at = lines.index("  tunebench's notes:")
    assert lines[at + 1:at + 3] == ["    - token counts: the engine's own tokenizer",
                                    "    - the trace implies 55.4% of prompt tokens from the cache"]
    assert "engine warming up" not in out and "engine log:" not in out
    code, out, _ = run_cli(capsys, "runs", "show", "1", "--db", str(db), "--log")
    assert "    | INFO engine warming up" in out and "    | tunebench: token counts: the engine's own tokenizer" in out
    code, out, _ = run_cli(capsys, "runs", "show", "2", "--db", str(db))
    assert "tunebench's notes" not in out  # a run without notes has no such section


def test_a_team_store_lists_whose_runs_and_guards_them(store_at: str, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for author in ("ada", "bob"):
        with RunStore(store_at, author=author) as store:
            store.finish_run(store.create_run(name=f"{author}'s run", hardware={"gpus": [{"name": "NVIDIA L4"}]}),
                             "completed")
    code, out, _ = run_cli(capsys, "runs", "list", "--db", store_at)
    assert code == 0 and "BY" in out and "ada@" in out and "bob@" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--db", store_at, "--author", "bob", "--gpu", "L4", "--json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["bob's run"]
    code, out, _ = run_cli(capsys, "runs", "list", "--db", store_at, "--host", "nowhere")
    assert code == 0 and "no runs match" in out
    monkeypatch.setenv("TUNEBENCH_AUTHOR", "ada")
    code, _, err = run_cli(capsys, "runs", "delete", "bob's run", "ada's run", "--db", store_at)
    assert code == 2 and "recorded by someone else" in err and "(bob)" in err and "--force" in err
    with RunStore(store_at) as store:
        assert len(store.list_runs()) == 2  # nothing deleted
    code, out, _ = run_cli(capsys, "runs", "delete", "bob's run", "ada's run", "--db", store_at, "--force")
    assert code == 0 and out.count("deleted run") == 2
