from __future__ import annotations

import time

import pytest

from farm.core.errors import SpecError
from farm.core.models import BackendName
from farm.core.spec import JobKind, Policy, parse_spec, shard_ranges

VALID = """
name: digits-infer
kind: inference
model: examples.digits.model:build
weights: examples/digits/weights.pt
dataset: examples.digits.data:test_set
shards: 8
batch_size: 64
backends: [cuda, cpu]
policy: throughput
tolerance: {atol: 1.0e-3}
output: out/x
"""


def test_parses_the_fields_of_a_valid_spec() -> None:
    spec = parse_spec(VALID)
    assert spec.kind is JobKind.INFERENCE
    assert spec.backends == (BackendName.CUDA, BackendName.CPU)
    assert spec.policy is Policy.THROUGHPUT
    assert spec.tolerance.atol == 1e-3 and spec.tolerance.rtol == 1e-4
    assert (spec.shards, spec.batch_size, spec.output_dir) == (8, 64, "out/x")


def test_defaults() -> None:
    spec = parse_spec("name: a\nmodel: m:build\ndataset: data.npz\n")
    assert spec.shards == 1 and spec.batch_size == 64 and spec.weights is None
    assert spec.backends == tuple(BackendName) and spec.policy is Policy.EFFICIENCY
    assert spec.output_dir == "out/a" and spec.dataset_is_file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\nmodel: m:b\ndataset: d.npy\nshardz: 2\n", "unknown field 'shardz'"),
        ("name: a\ndataset: d.npy\n", "missing required field 'model'"),
        ("name: a\nmodel: m.b\ndataset: d.npy\n", "field 'model': 'm.b' is not of the form"),
        ("name: a\nmodel: m:b\ndataset: d.csv\n", "field 'dataset'"),
        ("name: a\nmodel: m:b\ndataset: d.npy\nshards: 0\n", "field 'shards'"),
        ("name: a\nmodel: m:b\ndataset: d.npy\nbackends: [gpu]\n", "field 'backends.0'"),
        ("name: a\nmodel: m:b\ndataset: d.npy\nbackends: []\n", "at least one backend"),
        ("name: a\nmodel: m:b\ndataset: d.npy\npolicy: deadline\n", "needs deadline_s"),
        ("name: 'bad name'\nmodel: m:b\ndataset: d.npy\n", "field 'name'"),
        ("name: [unclosed\n", "not valid YAML (line"),
        ("- a\n- b\n", "expected a mapping of fields, got list"),
        ("", "expected a mapping of fields, got NoneType"),
        # A mapping whose key holds line breaks, as YAML shows it, is one line too (the fuzz test found it).
        ("name: {\"\\n\": null}\nmodel: m:b\ndataset: d.npy\n", "field 'name': expected text, got {"),
    ],
)
def test_bad_specs_give_one_line_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "job.yaml")
    assert str(caught.value).startswith("job.yaml: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("items", "shards"), [(540, 8), (10, 3), (7, 7), (3, 8), (1, 1), (10_001, 97)])
def test_shard_ranges_cover_every_item_once_in_order(items: int, shards: int) -> None:
    ranges = shard_ranges(items, shards)
    assert len(ranges) == min(items, shards)
    assert ranges[0][0] == 0 and ranges[-1][1] == items
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [stop - start for start, stop in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_an_empty_dataset_cannot_be_sharded() -> None:
    with pytest.raises(SpecError, match="empty"):
        shard_ranges(0, 4)


def test_a_tuning_budget_is_positive_and_bounded() -> None:
    assert parse_spec(VALID + "tune_budget_s: 90\n").tune_budget_s == 90
    assert parse_spec(VALID).tune_budget_s is None  # no tuning run: a cached winner or eager
    for bad in ("0", "-5", "7200"):
        with pytest.raises(SpecError, match="tune_budget_s"):
            parse_spec(VALID + f"tune_budget_s: {bad}\n")


def test_a_spec_with_aliases_is_refused_at_once() -> None:
    """Ten nested levels of aliases (each x10) in 466 bytes stalled the head for 11 s: aliases are refused."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 10) + "]")
    bomb = "name: bomb\nmodel: m:f\ndataset: d:f\n" + "\n".join(lines) + "\n"
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"not valid YAML \(line 5\): aliases \(\*name\) are not allowed"):
        parse_spec(bomb)
    assert time.monotonic() - started < 1.0


def test_shards_auto_or_a_number_and_the_energy_basis() -> None:
    auto = parse_spec("name: a\nmodel: m:b\ndataset: d.npy\nshards: auto\nenergy: total\n")
    assert auto.auto_shards and auto.shards == "auto" and auto.energy.value == "total"
    fixed = parse_spec("name: a\nmodel: m:b\ndataset: d.npy\n")
    assert not fixed.auto_shards and fixed.fixed_shards == 1 and fixed.energy.value == "marginal"  # the default
    for bad in ("many", "0", "10001", "true", "2.5"):
        with pytest.raises(SpecError, match="field 'shards': must be a number of shards from 1 to 10,000, or auto"):
            parse_spec(f"name: a\nmodel: m:b\ndataset: d.npy\nshards: {bad}\n")
    with pytest.raises(SpecError, match="field 'energy'"):
        parse_spec("name: a\nmodel: m:b\ndataset: d.npy\nenergy: some\n")


BASE = "name: x\nmodel: m:build\ndataset: d:rows\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("backends: {cuda: 1}\n", "field 'backends': expected a list of backends (cuda, ane, mps, cpu), got {cuda: 1}"),
        ("backends: [gpu]\n", "field 'backends.0': must be one of 'cuda', 'ane', 'mps' or 'cpu', not 'gpu'"),
        ("batch_size: lots\n", "field 'batch_size': expected a whole number, got 'lots'"),
        ("tolerance: 3\n", "field 'tolerance': expected a mapping (name: value lines), got 3"),
        ("shardz: 2\n", "unknown field 'shardz': did you mean 'shards'?"),
        ("batchsize: 2\n", "unknown field 'batchsize': did you mean 'batch_size'?"),
        ("tolerance: {atl: 1}\n", "unknown field 'tolerance.atl': did you mean 'atol'?"),
        ("zzz: 1\n", "unknown field 'zzz'"),
        # a key holding a line break (the fuzzer's find: the message was two lines)
        ('tolerance: {"\\n": null}\n', "unknown field 'tolerance.\\n'"),
        ('"a\\tb\\x00": 1\n', "unknown field 'a\\tb\\x00'"),
    ],
)
def test_spec_errors_are_in_words_not_pydantics(extra: str, message: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec(BASE + extra, "job.yaml")
    assert refused.value.message == f"job.yaml: {message}"
    assert "Input should be" not in refused.value.message and "valid tuple" not in refused.value.message


def test_one_backend_may_be_given_as_a_string() -> None:
    assert parse_spec(BASE + "backends: cpu\n").backends == (BackendName.CPU,)
