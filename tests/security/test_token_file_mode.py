"""Finding 13: a token file named by a profile was used without a word when every user of the machine could read
it. Now it is used with a warning, as ssh warns of a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.client.config import read_secret_file


def test_a_world_readable_token_file_is_warned_of(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    assert read_secret_file(token, "profile 'p''s token_file") == "secret"
    warning = capsys.readouterr().err
    assert "readable by other users" in warning and "0644" in warning and warning.count("\n") == 1


def test_a_private_token_file_is_read_quietly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o600)
    assert read_secret_file(token, "profile 'p''s token_file") == "secret"
    assert capsys.readouterr().err == ""
