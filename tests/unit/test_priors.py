"""Issue 31, item 10: a stale estimate put a whole job on one node. Calibration is keyed by what determines speed
(the code package and `env:`), a job plans only a short shard on other jobs' figures until its own shard confirms
them, and its own figures overrule a prior they contradict by more than 2x."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from farm.core.energy import Energy, EnergyScope, EnergySource
from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy, parse_spec
from farm.head import autoshard
from farm.head.kinds.base import model_key
from farm.head.store import Store
from farm.scheduler.calibration import Sample, rates
from farm.scheduler.sizing import Range, SizingRules, size_for, size_round
from farm.scheduler.types import Rate, ShardRequest

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
NVML_STEP_S = 0.1
RULES = SizingRules(shard_overhead_s=0.03, overhead_share=0.01)  # a 3 s target where the meter asks less
SPEC = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nbatch_size: 64\n"


def code(files: dict[str, bytes], stamp: tuple[int, ...] = (2026, 1, 1, 0, 0, 0)) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=stamp), data)
    return buffer.getvalue()


def node(node_id: str, fixture: str, *offers: BackendOffer) -> Node:
    hardware = Hardware.model_validate_json((NODES / f"{fixture}.json").read_text())
    return Node(id=node_id, name=node_id, state=NodeState.READY, hardware=hardware, backends=offers)


GPU = BackendOffer(name=BackendName.CUDA, device="cuda:0", meter_step_s=NVML_STEP_S)
CPU = BackendOffer(name=BackendName.CPU, device="cpu", threads=8)
FLEET = [node("h200", "h200-box", GPU), node("laptop", "laptop-cpu", CPU)]
JOB = ShardRequest(job_id="j-new", index=0, items=0, backends=tuple(BackendName), policy=Policy.THROUGHPUT)


def sample(items: int, seconds: float, job_id: str, at: float, node_id: str = "h200", device: str = "cuda:0",
           joules: float = 0.0) -> Sample:
    return Sample(node_id=node_id, device=device, items=items, seconds=seconds, job_id=job_id, finished_at=at,
                  energy_j=joules, energy_source="counter" if joules else "")


# --- the key ---------------------------------------------------------------------------------------------------------

def test_the_model_key_follows_the_code_package_and_the_jobs_environment() -> None:
    spec = parse_spec(SPEC)
    model = {"toyjob.py": b"def doubler(): ...\n"}
    key = model_key(spec, code(model))
    # A changed model file (no weights named: the key once read only the weights) is another model.
    assert model_key(spec, code({"toyjob.py": b"def doubler(): slower()\n"})) != key
    # A file added to the package, e.g. a helper module the model imports.
    assert model_key(spec, code({**model, "helpers.py": b"x = 1\n"})) != key
    # `env:` (a thread count changes the speed), and the packages the job asks for.
    assert model_key(parse_spec(SPEC + "env: {OMP_NUM_THREADS: 1}\n"), code(model)) != key
    assert model_key(parse_spec(SPEC + "requirements: [numpy==2.0.0]\n"), code(model)) != key
    # The same files zipped again (another submission: other timestamps) keep the key and its measurements.
    assert model_key(spec, code(model, stamp=(2027, 6, 1, 12, 0, 0))) == key
    assert len(key) == 16


# --- the job's own figures against a prior ----------------------------------------------------------------------------

def test_a_jobs_own_figures_overrule_a_prior_they_contradict_by_more_than_2x() -> None:
    prior = [sample(146_000, 1.0, "j-old", at) for at in (1.0, 2.0, 3.0)]  # the stale code's 146,000 rows/s
    own = [sample(4_000, 2.0, "j-new", 10.0)]  # this job's code: 2,000 rows/s
    found = rates([*prior, *own], job_id="j-new")[("h200", "cuda:0")]
    assert found.items_per_s == pytest.approx(2_000) and found.samples == 1 and not found.prior
    assert found.max_items == 4_000  # it grows from its own shard, not from the stale job's
    # Without a job to speak for, every shard counts alike (the pooled, wrong figure: what sized issue 31's shard).
    assert rates([*prior, *own])[("h200", "cuda:0")].items_per_s == pytest.approx(442_000 / 5.0)


def test_own_figures_within_2x_confirm_the_prior_and_pool_with_it() -> None:
    prior = [sample(100_000, 1.0, "j-old", at) for at in (1.0, 2.0)]
    own = [sample(256, 0.0016, "j-new", 10.0)]  # 160,000 rows/s: within 2x
    found = rates([*prior, *own], job_id="j-new")[("h200", "cuda:0")]
    assert found.samples == 3 and not found.prior and found.max_items == 100_000  # straight to the target next
    assert found.items_per_s == pytest.approx(200_256 / 2.0016)


def test_energy_per_row_off_by_more_than_2x_overrules_too() -> None:
    prior = [sample(10_000, 3.0, "j-old", 1.0, joules=100.0)]  # 100 rows/J
    own = [sample(10_000, 3.0, "j-new", 2.0, joules=400.0)]  # the same speed, 25 rows/J
    found = rates([*prior, *own], job_id="j-new")[("h200", "cuda:0")]
    assert found.items_per_j == pytest.approx(25.0) and found.samples == 1


def test_a_device_only_other_jobs_measured_is_a_prior() -> None:
    found = rates([sample(10_000, 1.0, "j-old", 1.0), sample(500, 1.0, "j-new", 2.0, "laptop", "cpu")],
                  job_id="j-new")
    assert found[("h200", "cuda:0")].prior and not found[("laptop", "cpu")].prior


# --- sizing on a prior ------------------------------------------------------------------------------------------------

def test_a_prior_sizes_one_short_shard_until_the_job_confirms_it() -> None:
    prior = Rate(items_per_s=146_000, samples=8, max_items=10**6, prior=True)
    rows, why = size_for(prior, NVML_STEP_S, 64, RULES)
    assert rows == 4 * 64 and "not confirmed" in why  # not 438,000 rows (3 s at the prior's figure)
    slow = Rate(items_per_s=50, samples=8, max_items=10**6, prior=True)  # a slow prior: its floor, 2 s (100 rows)
    assert size_for(slow, NVML_STEP_S, 64, RULES)[0] == 128  # two batches, not four
    assert size_for(prior.model_copy(update={"prior": False}), NVML_STEP_S, 64, RULES)[0] == 438_016


def test_a_stale_prior_does_not_put_the_whole_job_on_one_node() -> None:
    """Issue 31: 200,000 rows left, another job's figure says the GPU does them in 1.37 s; the laptop is measured by
    this job. Before: the GPU took all 200,000 rows (98 s) and the laptop waited."""
    measured = {("h200", "cuda:0"): Rate(items_per_s=146_000, samples=8, max_items=10**6, prior=True),
                ("laptop", "cpu"): Rate(items_per_s=2_000, samples=3, max_items=4_096)}
    sized = size_round(JOB, FLEET, {}, {}, measured, [Range(start=0, stop=200_000)], 64, rules=RULES)
    cuts = {c.node_id: c.size for c in sized.cuts}
    assert cuts["h200"] == 256  # its first shard of this job confirms the figure
    assert cuts["laptop"] == 6_016  # its own target (3 s at 2,000 rows/s), not "waits: faster devices finish"
    # While that shard runs, the GPU is planned nothing more on the prior.
    running = {("h200", "cuda:0"): [autoshard.RunningShard(items=256)]}
    again = size_round(JOB, FLEET, {}, running, measured, [Range(start=6_272, stop=200_000)], 64, rules=RULES)
    assert [c.node_id for c in again.cuts] == ["laptop"]
    assert any("confirming" in line for line in again.explanation)


def test_the_head_reads_a_jobs_own_shards_apart_from_its_models_other_jobs(tmp_path: Path) -> None:
    """What autoshard.size reads: the store's samples with their jobs, the job's own latest kept apart, so that the
    overrule sees them however busy the model's other jobs are."""
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", Hardware.model_validate_json((NODES / "h200-box.json").read_text()), [], "", "h")
    gpu = store.nodes()[0]
    energy = Energy(joules=1.0, seconds=1.0, source=EnergySource.COUNTER, scope=EnergyScope.DEVICE)
    store.add_job("j-old", "x", "inference", "", "", "", 40, [(i, i + 1) for i in range(40)], model_key="m")
    for index in range(40):
        store.shard_started("j-old", index, gpu, "cuda", "cuda:0")
        store.shard_succeeded("j-old", index, 146_000, 1.0, None, energy)
    store.add_job("j-new", "x", "inference", "", "", "", 1, [(0, 1)], model_key="m")
    store.shard_started("j-new", 0, gpu, "cuda", "cuda:0")
    store.shard_succeeded("j-new", 0, 2_000, 1.0, None, energy)
    store.add_job("j-later", "x", "inference", "", "", "", 10, [(i, i + 1) for i in range(10)], model_key="m")
    for index in range(10):  # another job of the model, finished after j-new's shard
        store.shard_started("j-later", index, gpu, "cuda", "cuda:0")
        store.shard_succeeded("j-later", index, 146_000, 1.0, None, energy)
    samples = store.samples("m", job_id="j-new")
    assert sum(s.job_id == "j-new" for s in samples) == 1 and len(samples) == 9
    found = rates(samples, job_id="j-new")[("n-1", "cuda:0")]
    assert found.items_per_s == pytest.approx(2_000) and not found.prior


def test_a_shard_being_written_counts_as_the_jobs_own(tmp_path: Path) -> None:
    """Its device's next shard is cut while the output is written (farm.head.dispatch's `writing`): that measurement
    is the job's own when the job has a shard ending on that device, so it confirms or overrules at once."""
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", Hardware.model_validate_json((NODES / "h200-box.json").read_text()), [], "", "h")
    store.add_job("j-new", "x", "inference", "", "", "", 2, [(0, 1), (1, 2)], model_key="m")
    store.shard_started("j-new", 0, store.nodes()[0], "cuda", "cuda:0")
    writing = [sample(2_000, 1.0, "", 5.0, "n-1"), sample(2_000, 1.0, "", 5.0, "n-2")]
    job = store.job("j-new")
    assert [s.job_id for s in autoshard.own_writing(job, {}, writing)] == ["j-new", ""]
    assert [s.job_id for s in autoshard.own_writing(job, {0: 1.0}, writing)] == ["", ""]  # still running: not it
