"""The agent daemon stays lean: its modules, and pinning the head's CA (hash, fetch over a real TLS handshake, the
stored copy), never load `cryptography` (~15 MB resident for the daemon's whole life); the node's key and CSR come
from the short-lived `python -m farm_agent --csr KEY_FILE` child instead, the key 0600 on disk and never printed."""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from farm.tls import HeadTLS
from farm.tls_pin import ca_hash

# Run in a fresh interpreter: this test process imports cryptography itself.
DAEMON_PATH = """
import asyncio, json, sys
from pathlib import Path
import farm_agent.daemon.main, farm_agent.daemon.client
from farm_agent.daemon.client import HeadClient, pin_head_ca
from farm_agent.daemon.settings import AgentSettings
from farm.tls_pin import ca_hash, fetch_ca, parse_ca_hash

head, ca_file, state = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
wanted = parse_ca_hash(ca_hash(ca_file.read_bytes()).upper().replace("SHA256", "sha256"))
fetched = fetch_ca(head, wanted)
settings = AgentSettings(head=head, token="t", name="n", state_dir=state, ca_hash=wanted)
pinned = pin_head_ca(settings)  # fetched from the head, then kept in the state folder
kept = pin_head_ca(settings)  # read back from the state folder
client = HeadClient(head, pinned, state / farm_agent.daemon.client.NODE_KEY_FILE)
asyncio.run(client.close())
print(json.dumps({"hash": wanted, "same": fetched == pinned == kept == ca_file.read_bytes(),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "cryptography")}))
"""


@pytest.fixture
def head_tls(tmp_path: Path) -> Iterator[tuple[str, HeadTLS, Path]]:
    """A TLS server presenting a Farm head's chain (server certificate, then CA) on 127.0.0.1: what fetch_ca reads."""
    folder = tmp_path / "head"
    tls = HeadTLS.load_or_create(folder, ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "head.pem", folder / "head.key")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)

    def serve() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                try:
                    with context.wrap_socket(conn, server_side=True):
                        pass
                except (OSError, ssl.SSLError):
                    pass
        except OSError:  # closed at teardown, or no client for 30 s
            return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", tls, folder / "ca.pem"
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way (Linux)
    listener.close()
    thread.join(timeout=5)


def test_the_daemon_pins_the_head_ca_without_loading_cryptography(
    head_tls: tuple[str, HeadTLS, Path], tmp_path: Path
) -> None:
    address, tls, ca_file = head_tls
    done = subprocess.run([sys.executable, "-c", DAEMON_PATH, address, str(ca_file), str(tmp_path / "agent")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"hash": tls.ca_hash, "same": True, "loaded": []}


def test_the_stdlib_ca_hash_is_the_hash_of_the_certificate_der(tmp_path: Path) -> None:
    tls = HeadTLS.load_or_create(tmp_path, ["127.0.0.1"])
    der = x509.load_pem_x509_certificate(tls.ca_pem).public_bytes(serialization.Encoding.DER)
    assert ca_hash(tls.ca_pem) == "sha256:" + hashlib.sha256(der).hexdigest() == tls.ca_hash
    assert ca_hash(tls.server_chain_pem) != tls.ca_hash  # the first certificate of a chain counts: the server's
    for junk in (b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"):
        with pytest.raises(ValueError):
            ca_hash(junk)


def test_the_csr_child_keeps_the_key_on_disk_and_prints_only_the_csr(tmp_path: Path) -> None:
    key_file = tmp_path / "agent" / "node.key"
    done = subprocess.run([sys.executable, "-m", "farm_agent", "--csr", str(key_file)], capture_output=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert b"PRIVATE KEY" not in done.stdout
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    csr = x509.load_pem_x509_csr(done.stdout)
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert csr.is_signature_valid and csr.public_key() == key.public_key()
    cert = x509.load_pem_x509_certificate(HeadTLS.load_or_create(tmp_path / "head", []).sign_node(done.stdout, "n-1"))
    assert cert.public_key() == key.public_key()


def test_the_csr_child_says_in_one_line_why_it_cannot_write_the_key(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run([sys.executable, "-m", "farm_agent", "--csr", str(blocker / "node.key")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("--csr ") and "Traceback" not in done.stderr and done.stdout == ""


def test_the_farm_cli_loads_no_cryptography_until_a_head_starts() -> None:
    """An installed agent service runs `farm agent start` in the foreground: the CLI it runs in lives as long."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, farm.cli.main, farm.cli.agent, farm_agent.daemon.main; "
                               "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
