"""Findings 5 and 9: a job's output folder swapped for a link after submit made the head write into its own state
folder, and `farm jobs delete --outputs` delete files elsewhere through it; `--overwrite` removed the user's own
*.parquet files, which README says it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.errors import FarmError
from farm.head import output_folder, output_place
from farm.head.settings import HeadSettings


def user_folder(tmp_path: Path) -> Path:
    """A folder a local user owns (here, group-writable: someone else may swap what is in it)."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    return home


def test_delete_outputs_never_deletes_through_a_swapped_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "root-owned"
    elsewhere.mkdir()
    for name in ("manifest.json", "shard-00000.parquet", "results.csv"):
        (elsewhere / name).write_text("root's")
    out = user_folder(tmp_path) / "out"
    out.symlink_to(elsewhere)  # the job's folder, swapped for a link after the job
    output_folder.remove_results(str(out))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["manifest.json", "results.csv", "shard-00000.parquet"]


def test_a_write_into_a_folder_swapped_for_a_link_to_the_state_folder_is_refused(tmp_path: Path) -> None:
    settings = HeadSettings(state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    out = user_folder(tmp_path) / "out"
    out.mkdir()
    output_place.recheck(str(out), settings)  # as submitted: fine
    out.rmdir()
    out.symlink_to(settings.state_dir)
    with pytest.raises(FarmError):
        output_place.recheck(str(out), settings)


def test_overwrite_removes_farm_s_files_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    farm_files = ["manifest.json", "shard-00000.parquet", "shard-00001.parquet", ".shard-00002.parquet.x1"]
    for name in [*farm_files, "mine.parquet", "shard-notes.txt"]:
        (out / name).write_text("x")
    output_folder.claim(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["mine.parquet", "shard-notes.txt"]


def test_delete_outputs_removes_farm_s_files_and_keeps_the_user_s(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step-00000010.safetensors").write_text("x")
    for name in ("manifest.json", "shard-00000.parquet", "mine.parquet"):
        (out / name).write_text("x")
    output_folder.remove_results(str(out))
    assert sorted(p.name for p in out.iterdir()) == ["mine.parquet"]
    (out / "mine.parquet").unlink()
    (out / "shard-00000.parquet").write_text("x")
    output_folder.remove_results(str(out))
    assert not out.exists()
