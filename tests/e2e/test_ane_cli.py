"""`farm ane convert`: the real command line converts a job's model and describes the package; bad input gets one
line on stderr and exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, farm

pytest.importorskip("coremltools", reason="coremltools is in the dev and apple extras")

DIGITS = str(ROOT / "examples" / "digits" / "infer.yaml")


def assert_one_line_error(result: object, *fragments: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, (result.returncode, stderr)  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_convert_prints_the_package_as_json(tmp_path: Path) -> None:
    out = tmp_path / "digits.mlpackage"
    result = farm("ane", "convert", DIGITS, "--out", str(out), "--buckets", "8,1", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert out.is_dir() and doc["package"] == str(out)
    assert (doc["model"], doc["precision"], doc["compute_units"], doc["buckets"]) == (
        "examples.digits.model:build", "float16", "CPU_AND_NE", [1, 8])
    assert [(f["name"], f["inputs"], f["outputs"]) for f in doc["functions"]] == [
        (f"batch_{b}", [{"name": "input", "shape": [b, 1, 8, 8], "dtype": "float32"}],
         [{"name": "output", "shape": [b, 10], "dtype": "float32"}]) for b in (1, 8)
    ]
    assert doc["functions"][1]["ops"]["conv"] == 2
    assert any("last axis" in note for note in doc["ane_notes"])


def test_convert_prints_ops_shapes_and_notes_for_people(tmp_path: Path) -> None:
    result = farm("ane", "convert", DIGITS, "--out", str(tmp_path / "d.mlpackage"), "--buckets", "8")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps long lines
    for fragment in ("precision float16, compute units CPU_AND_NE", "batch_8", "input [8, 1, 8, 8] float32",
                     "output [8, 10] float32", "max_pool", "Neural Engine notes", "MLComputePlan"):
        assert fragment in text, fragment


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["nosuch.yaml", "--out", "x.mlpackage"], ["nosuch.yaml: no such file"]),
        ([DIGITS, "--out", "x.zip"], ["must end in .mlpackage"]),
        ([DIGITS, "--out", "x.mlpackage", "--buckets", "8,a"], ["--buckets '8,a'", "comma-separated"]),
        ([DIGITS, "--out", "x.mlpackage", "--buckets", "0"], ["positive"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(farm("ane", "convert", *args, cwd=tmp_path), *fragments)


def test_a_model_core_ml_cannot_convert_is_a_user_error(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "apple" / "anejob.py", tmp_path / "anejob.py")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: inv\nmodel: anejob:inverse\ndataset: anejob:matrices\n")
    result = farm("ane", "convert", str(spec), "--out", str(tmp_path / "inv.mlpackage"), "--buckets", "1",
                  "--workdir", str(tmp_path))
    assert_one_line_error(result, "model 'anejob:inverse' does not convert to Core ML", "linalg_inv")
    assert not (tmp_path / "inv.mlpackage").exists()
