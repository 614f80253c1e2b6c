"""The submit preflight's model check (farm.client.check → farm_agent.work.check in a child process): the model runs on
CPU over the dataset's first rows, and what a node would fail on is one line at submit, within time and memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from farm.client.check import check_job
from farm.core.errors import SpecError
from farm.core.spec import parse_spec
from tests.conftest import FIXTURES

pytestmark = pytest.mark.slow  # each check starts a Python that imports torch


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    (tmp_path / "heavy.py").write_text(
        "import time\n\nimport numpy as np\nimport torch\n\n"
        "def hangs():\n    time.sleep(60)\n    return torch.nn.Identity()\n\n"
        "def hogs():\n    hog = np.ones(2**31 // 8)\n    time.sleep(60)\n    return torch.nn.Identity()\n"
    )
    return tmp_path


def check(work: Path, model: str, dataset: str = "toyjob:numbers", **limits: float) -> int:
    spec = parse_spec(f"name: x\nmodel: {model}\ndataset: {dataset}\n", "spec")
    return check_job(spec, work, **limits).model_bytes  # type: ignore[arg-type]


def test_a_model_that_runs_gives_its_size(work: Path) -> None:
    assert check(work, "toyjob:linear", "toyjob:numbers") == (2 * 3 + 3) * 4


@pytest.mark.parametrize(
    ("model", "dataset", "fragments"),
    [
        ("toyjob:linear", "toyjob:float64_numbers",
         ["fails on the dataset's first 2 rows on CPU: RuntimeError", "the dataset is float64 and the model's "
          "parameters are float32", "astype(np.float32)"]),
        ("toyjob:summer", "toyjob:numbers", ["outputs of shape ()", "one output row per input row"]),
        ("toyjob:broken", "toyjob:numbers", ["ValueError: this model is broken on purpose"]),
        ("toyjob:not_a_module", "toyjob:numbers", ["returned int, not a torch.nn.Module"]),
    ],
)
def test_what_a_node_would_fail_on_is_one_line_here(work: Path, model: str, dataset: str,
                                                    fragments: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        check(work, model, dataset)
    assert "\n" not in caught.value.message
    for fragment in fragments:
        assert fragment in caught.value.message


def test_the_check_is_bounded_in_time_and_memory(work: Path) -> None:
    with pytest.raises(SpecError, match="took over 3 s to load the dataset and run the model"):
        check(work, "heavy:hangs", timeout_s=3)
    with pytest.raises(SpecError, match="took over 1024 MB to load the dataset"):
        check(work, "heavy:hogs", memory_mb=1024)


def test_without_the_check_only_the_dataset_loads(work: Path) -> None:
    spec = parse_spec("name: x\nmodel: toyjob:broken\ndataset: toyjob:numbers\n", "spec")
    found = check_job(spec, work, check=False)
    assert (found.items, found.model_bytes, found.checked) == (32, 0, False)
