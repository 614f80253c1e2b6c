"""One large file from the head to one node on loopback, with TLS, on 1, 2, 4 and 8 streams (issue 28, item 4).

    PYTHONPATH=.:agents python benchmarks/data_streams.py [--mib 2048] [--repeat 2] [--lanes N]

A real head (its gRPC server with TLS and its data lanes, in a process of its own, as deployed) serves one file of
`--mib` MiB, hot in the page cache; this process reads it as a node does, through
farm.data.locations.head.HeadFileSystem, two ways (`--reads`): `whole` (cat_file: 64 MiB ranges of 4 MiB pieces,
`streams` of them in flight, joined into one object at the end) and `in-order`, as a job's reader does (16 MiB reads
of an open file, its blocks read ahead). On three ports (`--ports`):
- `main`: the head's main port, every stream on one connection (what nodes did before the data port): the head's
  one event loop sends all of it;
- `lanes`: the head's data port, each stream on a connection of its own, which the kernel hands to one of the
  head's `--lanes` data lanes (default: one per core, at most 8), each sending on a thread of its own;
- `bulk`: the head's bulk port (farm.head.bulk, what nodes use now), each stream on a plain TLS connection of its
  own: a thread a connection on the head, a relay process a connection on the node
  (farm.data.locations.bulk_relay).

`head cores` is the head process's CPU time over the read's wall time, `its busiest thread` that of its busiest
thread (on the main port, the event loop's: the ceiling one stream there met), `node cores` this process's and its
relays'; `head peak MiB` the head's peak RSS growth (the service stays bounded whatever the file's size). The
machine should be quiet (`uptime`); the best of `--repeat`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from benchmarks.data_service import Peak, big_file, start, stop  # noqa: E402
from farm.data.locations.head import PIECE, HeadFileSystem  # noqa: E402

HEAD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tests.integration.inprocess_head import running_head
    with running_head(Path(sys.argv[1]), data_lanes=int(sys.argv[2])) as head:
        print(head.settings.port, head.settings.data_listen_port, head.settings.bulk_listen_port, flush=True)
        sys.stdin.read()
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=min(8, os.cpu_count() or 1), help="the head's data lanes")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--ports", nargs="+", choices=["main", "lanes", "bulk"], default=["main", "lanes", "bulk"])
    parser.add_argument("--reads", nargs="+", choices=["whole", "in-order"], default=["whole", "in-order"])
    args = parser.parse_args()

    import dataclasses

    from farm.core.dataset import DatasetSpec
    from farm.head.settings import HeadSettings
    from tests.integration.inprocess_head import Head
    from tests.integration.test_data_service import add_job

    table = Table(title=f"The head's DataService with TLS: one {args.mib:,} MiB file to one node on loopback "
                        f"({os.cpu_count()} CPUs, {args.lanes} data lanes; best of {args.repeat})",
                  title_justify="left")
    for column in ("port", "read", "streams", "connections", "GB/s", "head cores", "its busiest thread", "node cores",
                   "head peak MiB"):
        table.add_column(column, justify="left" if column in ("port", "read") else "right")
    with tempfile.TemporaryDirectory() as tmp:
        data = big_file(Path(tmp) / "big.npy", args.mib)
        size = data.stat().st_size
        state = Path(tmp) / "state"
        process, (port, data_port, bulk_port) = start(HEAD, str(state), str(args.lanes))
        try:
            assert process.stdout is not None
            head = Head.__new__(Head)  # what add_job needs of a head: its settings, store and CA
            head.settings = HeadSettings(state_dir=state, host="127.0.0.1", port=port, data_lanes=args.lanes,
                                         data_port=data_port, bulk_port=bulk_port)
            head.ca_pem = (head.settings.tls_dir / "ca.pem").read_bytes()
            head.db = state / "state.db"
            access, _ = add_job(head, "j-1", DatasetSpec(location=str(data), format="npy"))
            ways = {"main": ("main (one connection)", dataclasses.replace(access, data_address="")),
                    "lanes": ("data lanes", access),
                    "bulk": ("bulk port (plain TLS)",
                             dataclasses.replace(access, bulk_address=head.settings.bulk_address))}
            head_process, me = psutil.Process(process.pid), psutil.Process()
            for (label, reach), how, streams in itertools.product([ways[p] for p in args.ports], args.reads,
                                                                   args.streams):
                fs = HeadFileSystem(reach, streams=streams)
                head_bytes = fs.read_range("", 0, streams * PIECE)  # connected (the relays started) before the clock
                with data.open("rb") as original:
                    assert head_bytes == original.read(len(head_bytes))
                best = (0.0, 0.0, 0.0, 0.0)
                peak = Peak(process.pid)
                for _ in range(args.repeat):
                    threads = _threads(head_process)
                    h0, m0, t0 = _cpu(head_process), _node_cpu(me, process.pid), time.perf_counter()
                    got = len(fs.cat_file("")) if how == "whole" else _in_order(fs)
                    seconds = time.perf_counter() - t0
                    assert got == size, (got, size)
                    rate = size / seconds / 1e9
                    if rate > best[0]:
                        busiest = max(t - threads.get(k, 0.0) for k, t in _threads(head_process).items())
                        best = (rate, (_cpu(head_process) - h0) / seconds, busiest / seconds,
                                (_node_cpu(me, process.pid) - m0) / seconds)
                connections = streams if fs.bulk is not None else len(fs.stubs)
                table.add_row(label, how, str(streams), str(connections), f"{best[0]:.2f}", f"{best[1]:.2f}",
                              f"{best[2]:.2f}", f"{best[3]:.2f}", f"{peak.stop():.0f}")
                print(label, how, streams, f"{best[0]:.2f} GB/s", file=sys.stderr, flush=True)
        finally:
            stop(process)
    Console(width=140).print(table)


def _threads(process: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def _in_order(fs: HeadFileSystem) -> int:
    """The file read as a job's reader reads it (farm.data.formats.npy): an open file's 16 MiB reads, discarded."""
    got = 0
    with fs.open("", "rb") as handle:
        while chunk := handle.read(16 << 20):
            got += len(chunk)
    return got


def _node_cpu(me: psutil.Process, head: int) -> float:
    """This process's CPU time and its children's but the head's: the bulk port's relays (they stay between reads)."""
    return _cpu(me) + sum(_cpu(child) for child in me.children() if child.pid != head)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()
