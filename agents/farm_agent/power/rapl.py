"""Linux CPU packages through RAPL (Running Average Power Limit) in the powercap sysfs tree.

Each CPU package is a zone /sys/class/powercap/intel-rapl:N whose `name` starts with "package" ("package-0"); its
`energy_uj` is a cumulative counter in microjoules that wraps at `max_energy_range_uj`. AMD Zen parts show up in the
same tree (the kernel's RAPL driver serves both). Read and summed over packages: source counter, scope package.

Left out on purpose: subzones (intel-rapl:N:M: core, uncore, dram: parts of a package, or beside it), "psys" (the
whole platform on some laptops: a different scope) and intel-rapl-mmio:N (a second interface to the same package
counter: summing it would count the package twice).

Wrap-around: a counter that reads lower at the end of a window than at its start wrapped once, so the window adds
max_energy_range_uj. Two wraps in one window cannot be told from one: the range is ~262 kJ on most parts, ~20 min
at 200 W, so windows (shards) stay well inside it; `power()` readings taken between windows do not help here, and
Farm does not run a poller (Zeus spawns a process per package for this).

Permissions: since November 2020 (CVE-2020-8694, "PLATYPUS") `energy_uj` is readable by root only on most
distributions. The agent does not run as root, so there RAPL is unavailable and says why; `meter_for("cpu")` then
falls back to the model estimate. To use the counter, grant read access to those files (e.g. a udev rule).

The counter updates about every millisecond, so unlike NVML's 100 ms steps no alignment is needed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from farm.core.energy import Energy, EnergyScope, EnergySource, Power
from farm_agent.power import Clock, EnergyWindow

log = logging.getLogger("farm.agent.power.rapl")

POWERCAP = Path("sys/class/powercap")
ZONE = re.compile(r"intel-rapl:\d+")  # a top-level zone; subzones are intel-rapl:N:M

ReadText = Callable[[Path], str]


def read_text(path: Path) -> str:
    """How sysfs files are read. Tests pass (or patch in) one that raises PermissionError, as a non-root agent meets
    it: the tests run as root here, where chmod cannot make a file unreadable."""
    return path.read_text()


@dataclass(frozen=True)
class RaplZone:
    path: Path  # .../intel-rapl:N
    name: str  # "package-0"
    max_range_uj: int  # energy_uj wraps to 0 after this

    @property
    def energy_path(self) -> Path:
        return self.path / "energy_uj"


def delta_uj(before: int, after: int, max_range_uj: int) -> int:
    """Microjoules between two reads of one counter that wraps at max_range_uj (at most once in between)."""
    return after - before if after >= before else after + max_range_uj - before


def package_zones(root: Path = Path("/"), read: ReadText | None = None) -> tuple[list[RaplZone], str]:
    """The package zones under `root` whose counters can be read, or ([], why not)."""
    read = read or read_text
    base = root / POWERCAP
    if not base.is_dir():
        return [], f"RAPL: {base} does not exist (no powercap driver, a VM, or not Linux)"
    zones = []
    for path in sorted(base.iterdir(), key=lambda p: p.name):
        if not ZONE.fullmatch(path.name):
            continue
        try:
            name = read(path / "name").strip()
        except OSError as exc:
            log.debug("RAPL: skipping %s: %s", path, exc)
            continue
        if not name.startswith("package"):
            continue
        try:
            int(read(path / "energy_uj"))
            max_range = int(read(path / "max_energy_range_uj"))
        except PermissionError:
            return [], (f"RAPL: permission denied reading {path / 'energy_uj'} (root-only since November 2020, "
                        f"CVE-2020-8694; grant the agent read access to use the counter)")
        except (OSError, ValueError) as exc:
            return [], f"RAPL: cannot read {path}: {exc}"
        zones.append(RaplZone(path=path, name=name, max_range_uj=max_range))
    if not zones:
        return [], f"RAPL: no package zones under {base}"
    return zones, ""


class RaplMeter:
    """The sum of the RAPL package counters."""

    device = "cpu"
    source = EnergySource.COUNTER
    scope = EnergyScope.PACKAGE
    available = True
    step_s = 0.001  # the counters update about every millisecond

    def __init__(self, zones: list[RaplZone], *, clock: Clock = time.monotonic, read: ReadText | None = None,
                 reason: str = "") -> None:
        self.zones, self.reason = zones, reason
        self._clock, self._read = clock, read or read_text
        self._last = self._snapshot()  # for power(): the average since the previous reading

    def _snapshot(self) -> tuple[float, list[int]]:
        values = [int(self._read(z.energy_path)) for z in self.zones]
        return self._clock(), values

    def _joules(self, before: list[int], after: list[int]) -> float:
        return sum(delta_uj(b, a, z.max_range_uj) for z, b, a in zip(self.zones, before, after, strict=True)) / 1e6

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        t0, before = self._snapshot()
        try:
            yield w
        finally:
            t1, after = self._snapshot()
            energy = Energy(joules=self._joules(before, after), seconds=t1 - t0, source=self.source, scope=self.scope)
            w.close(energy, t1 - t0, f"{len(self.zones)} RAPL package(s)")

    def power(self) -> Power | None:
        """The average since the previous power() call (or since the meter was made); None if under 10 ms ago or
        unreadable."""
        try:
            now = self._snapshot()
        except (OSError, ValueError) as exc:
            log.debug("RAPL: %s", exc)
            return None
        (t0, before), (t1, after) = self._last, now
        if t1 - t0 < 0.01:
            return None
        self._last = now
        return Power(watts=self._joules(before, after) / (t1 - t0), source=self.source, scope=self.scope)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"RaplMeter({[z.name for z in self.zones]})"


def open_rapl_meter(root: Path = Path("/"), *, clock: Clock = time.monotonic,
                    read: ReadText | None = None) -> tuple[RaplMeter | None, str]:
    """(meter, "") where the package counters can be read, else (None, why not)."""
    zones, why = package_zones(root, read)
    if not zones:
        return None, why
    try:
        return RaplMeter(zones, clock=clock, read=read), ""
    except (OSError, ValueError) as exc:
        return None, f"RAPL: {exc}"
