"""Commands that only read (or change stored runs) never create a store: a ``--db`` that names
nothing is refused in one line naming it (exit 2), and nothing is made, neither the file nor its
folder. ``db copy`` refuses a source that is not there, and makes a destination's missing folder
only when asked (``--parents``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store import RunStore
from tests.fuzz.hostile import cli

READERS = (
    ("runs", "list"), ("runs", "show", "1"), ("runs", "delete", "1"), ("runs", "tag", "1", "x"),
    ("runs", "rename", "1", "y"), ("compare", "1", "2"), ("export", "1", "--format", "csv"),
    ("capacity", "1", "--slo", "ttft_ms<=500", "--users", "10"), ("tunes", "list"), ("tunes", "show", "t1"),
    ("ladders", "list"), ("ladders", "show", "l1"), ("resume", "t1"), ("db", "check"),
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A folder of the test's own (``tmp_path`` holds the engine registry's state too)."""
    folder = tmp_path / "root"
    folder.mkdir()
    return folder


def _files_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "sqlite-url"])
@pytest.mark.parametrize("argv", READERS, ids=[" ".join(a) for a in READERS])
def test_a_reader_refuses_a_store_that_is_not_there_and_creates_nothing(argv: tuple[str, ...], as_url: bool,
                                                                        root: Path) -> None:
    missing = root / "no" / "such" / "dir" / "x.db"
    outcome = cli(*argv, "--db", f"sqlite:///{missing}" if as_url else str(missing)).check(allowed=(2,))
    assert _files_under(root) == [], (outcome, _files_under(root))
    error = [line for line in outcome.err.splitlines() if "error:" in line]
    assert len(error) == 1 and f"there is no run database at {missing}" in error[0], outcome


def test_db_copy_refuses_a_source_that_is_not_there(root: Path) -> None:
    source, dest = root / "no" / "such" / "source.db", root / "dest.db"
    outcome = cli("db", "copy", str(source), str(dest)).check(allowed=(2,))
    assert f"there is no run database at {source}" in outcome.err, outcome
    assert "copied" not in outcome.out and _files_under(root) == [], (outcome, _files_under(root))


def test_db_copy_makes_a_missing_destination_folder_only_when_asked(seeded_db: Path, root: Path) -> None:
    folder = root / "no" / "such" / "dir"
    dest = folder / "out.db"
    refused = cli("db", "copy", str(seeded_db), str(dest)).check(allowed=(2,))
    assert f"the destination's folder {folder} does not exist" in refused.err and "--parents" in refused.err, refused
    assert _files_under(root) == [], _files_under(root)
    done = cli("db", "copy", "--parents", str(seeded_db), str(dest))  # its progress lines go to stderr too
    assert done.code == 0 and "Traceback" not in done.err, done
    assert f"created the folder {folder}" in done.err and "copied 3 runs" in done.out, done
    with RunStore(dest) as store:
        assert len(store.list_runs()) == 3


def test_a_shipped_profiles_script_needs_no_store_and_makes_none(root: Path) -> None:
    missing = root / "no" / "such" / "x.db"
    outcome = cli("export", "cpu-demo", "--format", "bash", "--db", str(missing)).check(allowed=(0,))
    assert outcome.out.startswith("#!/usr/bin/env bash") and _files_under(root) == [], outcome
