"""Finding 4: `farm results` wrote where a (fake) head's file names said, `../../.bashrc` included, and followed a
link planted as its resume file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from farm.client.results import download
from farm.core.errors import FarmError
from tests.security.fake_head import FakeHead, Listed


@pytest.mark.parametrize("name", ["../../escaped.txt", "{tmp}/escaped.txt", "sub/dir.parquet", "..", ".hidden"])
def test_a_name_that_is_not_a_plain_file_name_is_refused_before_anything_is_written(tmp_path: Path,
                                                                                   name: str) -> None:
    name = name.format(tmp=tmp_path)  # an absolute path, inside this test's folder
    out = tmp_path / "a" / "b" / "out"
    with FakeHead([Listed(name, b"pwned\n")]) as (head, client):
        with pytest.raises(FarmError) as refused:
            download(client, "j1", out)
    assert "not a plain file name" in refused.value.message
    assert head.results.asked == []  # nothing was fetched
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not out.exists() or not list(out.rglob("*"))


def test_the_resume_file_is_not_followed_when_it_is_a_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / ".shard-00000.parquet.part").symlink_to(victim)
    with FakeHead([Listed("shard-00000.parquet", b"result bytes")]) as (_, client):
        with pytest.raises(FarmError):
            download(client, "j1", out)
    assert victim.read_text() == "precious\n"


def test_more_bytes_than_listed_are_refused(tmp_path: Path) -> None:
    with FakeHead([Listed("shard-00000.parquet", b"x" * 4096, size=10)]) as (_, client):
        with pytest.raises(FarmError):
            download(client, "j1", tmp_path / "out")


def test_plain_names_download(tmp_path: Path) -> None:
    with FakeHead([Listed("shard-00000.parquet", b"rows"), Listed("manifest.json", b"{}", shard=-1)]) as (_, client):
        fetched = download(client, "j1", tmp_path / "out")
    assert sorted(p.name for p in fetched.files) == ["manifest.json", "shard-00000.parquet"]
    assert (tmp_path / "out" / "shard-00000.parquet").read_bytes() == b"rows"
    assert not any(p.name.startswith(".") for p in os.scandir(tmp_path / "out"))
