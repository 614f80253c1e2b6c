"""Job specs from hypothesis: arbitrary text, arbitrary YAML mappings, and valid specs with one field made arbitrary.
Whatever comes in, the parser returns a spec or raises a SpecError of one line, never another exception; the
preflight's read_spec, which reads the file a user names, does the same with bytes that are not even text."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from farm.client.preflight import read_spec
from farm.core.errors import SpecError
from farm.core.spec import SpecBase, parse_spec

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

VALID: dict[str, Any] = {
    "name": "digits-infer", "kind": "inference", "model": "examples.digits.model:build",
    "weights": "examples/digits/weights.pt", "dataset": "examples.digits.data:test_set", "shards": 8,
    "batch_size": 64, "backends": ["cpu", "cuda"], "policy": "efficiency", "deadline_s": 300,
    "tolerance": {"atol": 1e-4, "rtol": 1e-4}, "output": "out/digits-infer",
}
FIELDS = [*VALID, "training", "tune_budget_s"]

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
           | st.text(max_size=40) | st.sampled_from(["cpu", "cuda", "inference", "training", "sync", "", "-1"]))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10) | st.sampled_from(FIELDS),
                                                                 inner, max_size=4),
    max_leaves=12,
)


def check(text: str) -> None:
    try:
        spec = parse_spec(text, "fuzz.yaml")
    except SpecError as exc:
        assert exc.message and "\n" not in exc.message, repr(exc.message)
        assert exc.message.startswith("fuzz.yaml: ")
    else:
        assert isinstance(spec, SpecBase)


@FUZZ
@given(st.text(max_size=300))
@example("[" * 1200)  # PyYAML recurses per level: deep nesting once ended in a RecursionError
@example("name: " + "{a: " * 1200)
@example("name: &a [*a]")  # an alias inside itself
def test_any_text(text: str) -> None:
    check(text)


@settings(FUZZ, max_examples=20)
@given(st.integers(min_value=1, max_value=1500), st.sampled_from(["[", "{a: ", "- "]))
def test_nesting_of_any_depth(depth: int, opener: str) -> None:
    check("name: " + opener * depth)


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), values, max_size=8))
def test_any_mapping(fields: dict[str, Any]) -> None:
    check(yaml.safe_dump(fields, allow_unicode=True))


@FUZZ
@given(st.sampled_from(FIELDS), values, st.sets(st.sampled_from(list(VALID)), max_size=3))
def test_a_valid_spec_with_one_field_changed_and_some_left_out(field: str, value: Any, dropped: set[str]) -> None:
    fields = {k: v for k, v in VALID.items() if k not in dropped}
    fields[field] = value
    check(yaml.safe_dump(fields, allow_unicode=True))


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_a_spec_file_of_any_bytes_through_the_preflight(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.yaml"
        path.write_bytes(data)
        try:
            _, spec = read_spec(path, Path(folder))
        except SpecError as exc:
            assert exc.message and "\n" not in exc.message, repr(exc.message)
        else:
            assert isinstance(spec, SpecBase)


def test_the_valid_spec_parses() -> None:  # the base the mutations start from is valid: they test real edges
    assert parse_spec(yaml.safe_dump(VALID)).name == "digits-infer"
