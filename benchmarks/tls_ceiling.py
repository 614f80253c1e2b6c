"""How fast plain TLS sockets carry a large file on loopback in Python, one connection a thread (issue 28, item 4):
the ceiling a bulk transport outside gRPC could reach, against the head's DataService (benchmarks/data_streams.py).

    python benchmarks/tls_ceiling.py [--mib 2048] [--piece-mib 4] [--connections 1 2 4 8]

A server thread per connection reads 4 MiB pieces of one file (os.pread, hot in the page cache) and sends them with
ssl's sendall; a client thread per connection asks for pieces in turn and receives each into one preallocated
buffer (recv_into). Both release the GIL inside OpenSSL and the kernel, so threads of one process may use several
cores. TLS 1.3 with a fresh self-signed certificate (AES-GCM, as the head's gRPC TLS negotiates). Prints GB/s and
the process's CPU time over the wall (client and server are one process here: their sum)."""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import ssl
import struct
import tempfile
import threading
import time
from pathlib import Path

REQUEST = struct.Struct("!QQ")  # offset, length; length 0 ends the connection


def certificate(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def serve(listener: socket.socket, context: ssl.SSLContext, fd: int, piece: int) -> None:
    while True:
        try:
            raw, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve_one, args=(context.wrap_socket(raw, server_side=True), fd, piece),
                         daemon=True).start()


def serve_one(conn: ssl.SSLSocket, fd: int, piece: int) -> None:
    with conn:
        header = bytearray(REQUEST.size)
        while True:
            view, got = memoryview(header), 0
            while got < REQUEST.size:
                n = conn.recv_into(view[got:])
                if not n:
                    return
                got += n
            offset, length = REQUEST.unpack(header)
            if length == 0:
                return
            conn.sendall(os.pread(fd, length, offset))


def read(address: tuple[int, int], context: ssl.SSLContext, pieces: list[tuple[int, int]], piece: int) -> None:
    buffer = bytearray(piece)
    with context.wrap_socket(socket.create_connection(address), server_hostname="localhost") as conn:
        for offset, length in pieces:
            conn.sendall(REQUEST.pack(offset, length))
            view, got = memoryview(buffer), 0
            while got < length:
                n = conn.recv_into(view[got:length])
                if not n:
                    raise ConnectionError("closed")
                got += n
        conn.sendall(REQUEST.pack(0, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--piece-mib", type=int, default=4)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tls-ceiling-"))
    data = folder / "data.bin"
    with open(data, "wb") as out:
        block = os.urandom(1 << 20)
        for _ in range(args.mib):
            out.write(block)
    cert, key = certificate(folder)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    fd = os.open(data, os.O_RDONLY)
    piece, size = args.piece_mib << 20, args.mib << 20
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener, server_context, fd, piece), daemon=True).start()
    address = listener.getsockname()
    print("| connections | GB/s | process cores |\n|---:|---:|---:|")
    for connections in args.connections:
        pieces = [(at, min(piece, size - at)) for at in range(0, size, piece)]
        shares = [pieces[i::connections] for i in range(connections)]
        cpu0, began = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=read, args=(address, client_context, share, piece)) for share in shares]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        print(f"| {connections} | {size / wall / 1e9:.2f} | {(time.process_time() - cpu0) / wall:.2f} |", flush=True)
    listener.close()
    os.close(fd)
    data.unlink()


if __name__ == "__main__":
    main()
