"""Run the chaos test with N seeds and count the passes:

    .venv/bin/python -m tests.chaos.runs N [--first-seed S]

One pytest run, FARM_CHAOS_RUNS=N seeds from S; prints each seed's outcome and "X of N chaos runs passed"; exits 1
if any failed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=int, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("runs must be at least 1")
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "chaos.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/chaos/test_chaos.py",
             f"--junitxml={report}"],
            cwd=ROOT, check=False,
            env={**os.environ, "FARM_CHAOS_RUNS": str(args.runs), "FARM_CHAOS_SEED": str(args.first_seed)},
        )
        if not report.exists():
            print("pytest wrote no report", file=sys.stderr)
            return 2
        cases = list(ET.parse(report).getroot().iter("testcase"))
    passed = 0
    for case in cases:
        outcome = next(iter(case), None)  # <failure>, <error> or <skipped>; none when it passed
        seed = case.get("name", "").rpartition("[")[2].rstrip("]")
        if outcome is None:
            passed += 1
            print(f"{seed}: passed ({float(case.get('time', 0)):.0f} s)")
        else:
            print(f"{seed}: {outcome.tag}: {(outcome.get('message') or '').splitlines()[0][:200]}")
    print(f"{passed} of {args.runs} chaos runs passed (seeds {args.first_seed}-{args.first_seed + args.runs - 1})")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
