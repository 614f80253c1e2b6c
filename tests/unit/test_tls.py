"""farm.tls and the failure limiter, without a network: the CA is made once and kept, the server certificate follows
its names and its CA, node certificates name their node, and the limiter refuses a peer after its allowance."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from farm.core.errors import UserError
from farm.head.auth import FailureLimiter, is_loopback
from farm.tls import HeadTLS, ca_hash, join_command, new_node_key, parse_ca_hash


def names_of(chain_pem: bytes) -> set[str]:
    cert = x509.load_pem_x509_certificate(chain_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in sans}


def test_the_ca_is_kept_and_the_server_certificate_follows_its_names(tmp_path: Path) -> None:
    first = HeadTLS.load_or_create(tmp_path, ["10.0.0.5", "127.0.0.1", "localhost", "0.0.0.0"])
    assert names_of(first.server_chain_pem) == {"10.0.0.5", "127.0.0.1", "localhost"}
    assert first.server_chain_pem.endswith(first.ca_pem)  # the chain carries the CA: joining agents read it off
    for key in ("ca.key", "head.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    again = HeadTLS.load_or_create(tmp_path, ["10.0.0.5", "127.0.0.1"])
    assert again == first  # nothing new to name: the same files
    moved = HeadTLS.load_or_create(tmp_path, ["10.0.0.9", "127.0.0.1"])
    assert moved.ca_pem == first.ca_pem and moved.server_chain_pem != first.server_chain_pem
    assert "10.0.0.9" in names_of(moved.server_chain_pem)


def test_an_adopted_ca_reissues_the_server_certificate(tmp_path: Path) -> None:
    first = HeadTLS.load_or_create(tmp_path, ["127.0.0.1"])
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # as Helm's genCA makes one
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chart CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.TraditionalOpenSSL,
                                                        serialization.NoEncryption()))
    adopted = HeadTLS.load_or_create(tmp_path, ["127.0.0.1"])
    assert adopted.ca_hash != first.ca_hash
    x509.load_pem_x509_certificate(adopted.server_chain_pem).verify_directly_issued_by(ca)


def test_node_certificates_name_the_node_the_head_chose(tmp_path: Path) -> None:
    tls = HeadTLS.load_or_create(tmp_path, ["127.0.0.1"])
    _, csr = new_node_key()
    cert = x509.load_pem_x509_certificate(tls.sign_node(csr, "n-1234"))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "n-1234"
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(tls.ca_pem))
    with pytest.raises(UserError, match="not valid PEM"):
        tls.sign_node(b"junk", "n-1234")


def test_ca_hash_form_and_join_line(tmp_path: Path) -> None:
    tls = HeadTLS.load_or_create(tmp_path, ["127.0.0.1"])
    assert parse_ca_hash(tls.ca_hash.upper().replace("SHA256", "sha256")) == tls.ca_hash == ca_hash(tls.ca_pem)
    for bad in ("", "sha256:12", "md5:" + "0" * 64, "sha256:" + "g" * 64):
        with pytest.raises(UserError, match="expected sha256:<64 hex digits>"):
            parse_ca_hash(bad)
    # The token in the environment, not on the command line (`ps` shows that to every user of the machine).
    assert join_command("h:1", "T", tls.ca_hash) == f"FARM_JOIN_TOKEN=T farm agent start --head h:1 --ca-hash {tls.ca_hash}"
    assert join_command("h:1", "T", "").endswith("--head h:1 --insecure")


def test_the_limiter_refuses_a_peer_after_its_allowance_then_forgives() -> None:
    now = [0.0]
    limiter = FailureLimiter(allowed=3, window_s=60, clock=lambda: now[0])
    for _ in range(2):
        limiter.failed("10.0.0.1")
    assert limiter.blocked_for("10.0.0.1") == 0
    now[0] = 61.0  # old failures leave the window
    limiter.failed("10.0.0.1")
    limiter.failed("10.0.0.1")
    assert limiter.blocked_for("10.0.0.1") == 0
    limiter.failed("10.0.0.1")
    assert limiter.blocked_for("10.0.0.1") == 60 and limiter.blocked_for("10.0.0.2") == 0
    now[0] = 121.5
    assert limiter.blocked_for("10.0.0.1") == 0
    local = FailureLimiter(allowed=1, window_s=60, exempt=is_loopback)
    for peer in ("127.0.0.1", "[::1]", "10.0.0.1"):
        local.failed(peer)
    assert (local.blocked_for("127.0.0.1"), local.blocked_for("[::1]")) == (0, 0) and local.blocked_for("10.0.0.1")
