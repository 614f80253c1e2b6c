"""Finding 11: a dataset URL with credentials in it (`http://user:pass@host/...`) stayed in the job log and its
error, shown to whoever reads jobs. Now they are redacted before they are stored."""

from __future__ import annotations

from pathlib import Path

from farm.core.models import JobState
from farm.head.store import Store

URL = "https://alice:s3cr3t-pass@data.example.com/sets/a.csv"


def test_credentials_in_a_url_never_reach_the_job_log_or_its_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        store.add_job("j-1", "j", "inference", "name: j", "", str(tmp_path / "out"), 10, [(0, 10)])
        store.log("j-1", "info", f"data: csv at {URL} (read by the nodes over http(s)): 10 rows in 1 file")
        store.set_job_state("j-1", JobState.FAILED, f"shard 0: cannot read {URL}: 404")
        shown = " ".join(line["message"] for line in store.logs("j-1")) + store.job("j-1").error
    finally:
        store.close()
    assert "s3cr3t-pass" not in shown and "alice" not in shown
    assert "https://***@data.example.com/sets/a.csv" in shown
