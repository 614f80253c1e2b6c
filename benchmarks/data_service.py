"""Where the time goes when a node reads a large file from the head's DataService on loopback (issue 28, item 4).

    PYTHONPATH=.:agents python benchmarks/data_service.py [--mib 1024] [--repeat 2]

A head (its gRPC server, in a process of its own, as in a deployment) serves one file of `--mib` MiB, hot in the page
cache; this process reads it as a node does, through farm.data.locations.head.HeadFileSystem. Each row changes one
thing: TLS or not, the bytes a message carries, how the node asks (whole file, or the 16 MiB blocks of a file object,
which is how the .npy and text formats read), so that the table shows what each costs. The ceilings first: the page
cache through os.preadv, and a bare grpc.aio stream of preallocated bytes (no file, no Farm). `head peak MiB` is the
head process's peak RSS growth during the row: the data service must stay bounded whatever the file's size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
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

HEAD = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    import farm.head.data_service as service
    service.CHUNK = int(sys.argv[3])
    if sys.argv[4] == "0":
        service.tune_malloc = lambda: False
    from tests.integration.inprocess_head import running_head
    with running_head(Path(sys.argv[1]), insecure=sys.argv[2] == "1") as head:
        print(head.settings.port, head.settings.data_listen_port, flush=True)
        sys.stdin.read()
""")

BARE = textwrap.dedent("""
    import asyncio, sys, grpc
    from farm.proto.v1 import data_pb2, data_pb2_grpc
    CHUNK = int(sys.argv[1])
    if sys.argv[2] == "1":
        from farm.data.locations.head import tune_malloc
        tune_malloc()
    class Bare(data_pb2_grpc.DataServiceServicer):
        async def Read(self, request, context):
            block = b"x" * CHUNK
            for _ in range(request.length // CHUNK):
                yield data_pb2.Chunk(data=block)
    async def main():
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
        data_pb2_grpc.add_DataServiceServicer_to_server(Bare(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    asyncio.run(main())
""")


class Peak:
    """A process's peak RSS, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        import threading

        self.process = psutil.Process(pid)
        self.base = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return (self.peak - self.base) / 2**20


def big_file(path: Path, mib: int) -> Path:
    """A .npy of `mib` rows of 1 MiB of random bytes (nothing a compressing path could shortcut)."""
    import numpy as np

    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(mib, 2**20))
    for row in range(mib):
        rows[row] = np.frombuffer(os.urandom(2**20), np.uint8)
    rows.flush()
    del rows
    return path


def start(code: str, *args: str) -> tuple[subprocess.Popen[str], list[int]]:
    """The process and the ports it printed."""
    # Farm's tree first, then whatever the caller's path had (the H200's wheels live in a folder of their own).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "agents"),
                                                                     os.environ.get("PYTHONPATH", "")]))}
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env, cwd=ROOT)
    assert process.stdout is not None
    return process, [int(port) for port in process.stdout.readline().split()]


def stop(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.close()
    process.wait(30)


def timed(read, size: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """The best GB/s of `repeat` reads (the machine is shared: the best is the least disturbed)."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = read()
        seconds = time.perf_counter() - t0
        assert got == size, (got, size)
        best = max(best, size / seconds / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import grpc

    from farm.core.dataset import DatasetSpec
    from farm.data.locations.head import BLOCK, HeadFileSystem
    from farm.proto.v1 import data_pb2, data_pb2_grpc
    from tests.integration.test_data_service import add_job

    table = Table(title=f"DataService, one {args.mib} MiB file to one node on loopback ({os.cpu_count()} CPUs)")
    for column in ("path", "malloc", "TLS", "message", "how the node reads", "GB/s", "head peak MiB"):
        table.add_column(column, justify="right" if column in ("GB/s", "head peak MiB") else "left")

    with tempfile.TemporaryDirectory() as tmp:
        data = big_file(Path(tmp) / "big.npy", args.mib)
        size = data.stat().st_size

        def preadv() -> int:
            buffer, done = bytearray(BLOCK), 0
            with data.open("rb", buffering=0) as handle:
                while n := os.preadv(handle.fileno(), [buffer], done):
                    done += n
            return done

        table.add_row("page cache (os.preadv)", "-", "-", "-", "16 MiB reads", f"{timed(preadv, size, args.repeat):.2f}",
                      "-")

        import farm.data.locations.head as located

        tune = located.tune_malloc
        # (malloc tuned, TLS, message bytes): glibc's settings are the process's for good, so the default rows first
        for tuned, tls, chunk in ((False, False, 1 << 20), (False, True, 1 << 20), (True, False, 1 << 20),
                                  (True, True, 1 << 20), (True, True, 4 << 20)):
            located.tune_malloc = tune if tuned else (lambda: False)  # type: ignore[assignment]
            if tuned:
                tune()
            malloc = "tuned" if tuned else "default"
            if not tls:
                process, (port,) = start(BARE, str(chunk), "1" if tuned else "0")
                peak = Peak(process.pid)
                with grpc.insecure_channel(f"127.0.0.1:{port}",
                                           options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
                    stub = data_pb2_grpc.DataServiceStub(channel)

                    def bare() -> int:
                        got = sum(len(c.data) for c in stub.Read(data_pb2.ReadRequest(length=size)))
                        return size if got == size // chunk * chunk else got

                    speed = timed(bare, size, args.repeat)
                table.add_row("bare grpc.aio stream", malloc, "no", f"{chunk >> 20} MiB", "one stream",
                              f"{speed:.2f}", f"{peak.stop():.0f}")
                stop(process)
            state = Path(tmp) / f"state-{tuned}-{tls}-{chunk}"
            process, (port, data_port) = start(HEAD, str(state), "0" if tls else "1", str(chunk),
                                               "1" if tuned else "0")
            from farm.head.settings import HeadSettings
            from tests.integration.inprocess_head import Head

            head = Head.__new__(Head)  # what add_job needs of a head: its settings, store and CA
            head.settings = HeadSettings(state_dir=state, host="127.0.0.1", port=port, data_port=data_port,
                                         insecure=not tls)  # the reader goes to the data lanes, as a node's
            head.db = state / "state.db"
            head.ca_pem = (head.settings.tls_dir / "ca.pem").read_bytes() if tls else b""
            access, _ = add_job(head, "j-1", DatasetSpec(location=str(data), format="npy"))
            fs = HeadFileSystem(access)

            def whole() -> int:
                return len(fs.cat_file(""))

            def blocks() -> int:
                done = 0
                with fs.open("", "rb") as handle:
                    while part := handle.read(BLOCK):
                        done += len(part)
                return done

            for how, read in (("cat_file (whole)", whole), ("file object, 16 MiB reads", blocks)):
                peak = Peak(process.pid)
                speed = timed(read, size, args.repeat)
                table.add_row("Farm DataService", malloc, "yes" if tls else "no", f"{chunk >> 20} MiB", how,
                              f"{speed:.2f}", f"{peak.stop():.0f}")
            stop(process)
    Console().print(table)


if __name__ == "__main__":
    main()
