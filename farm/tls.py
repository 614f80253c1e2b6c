"""TLS for the control plane: the head's own CA, its server certificate, the nodes' client certificates, and how a
client fetches the head's CA and pins it against the hash the join line carries (as kubeadm's
discovery-token-ca-cert-hash does).

Used by the head, the CLI and the agent's short-lived `--csr` child (the agent never imports farm.head). The agent
daemon itself never imports this module (it would keep `cryptography` resident): it pins the CA with farm.tls_pin,
standard library only, re-exported here. Keys are ECDSA P-256: quick to make, so a test head costs milliseconds, not
the seconds an RSA key would.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from farm.core.errors import UserError
from farm.local import write_private
from farm.tls_pin import ca_hash, fetch_ca, join_command, parse_ca_hash

__all__ = ["HeadTLS", "ca_hash", "fetch_ca", "join_command", "new_node_key", "parse_ca_hash"]

CA_DAYS = 3650  # the CA is what agents pin: it lives for years
SERVER_DAYS = 365  # the server certificate is renewed at start once it nears its end (or its names change)
RENEW_WITHIN_DAYS = 30
SERVER_CHAIN, SERVER_KEY = "head.pem", "head.key"  # in the head's tls/ folder
NODE_DAYS = 365  # a node's client certificate; a new one at each Register


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True)
class HeadTLS:
    """The head's CA and server identity, as PEM."""

    ca_pem: bytes
    ca_key_pem: bytes
    server_chain_pem: bytes  # the server certificate, then the CA's: a joining agent reads the CA off the handshake
    server_key_pem: bytes
    folder: Path | None = None  # where they are kept (the head's tls/)

    @property
    def ca_hash(self) -> str:
        return ca_hash(self.ca_pem)

    def server_context(self) -> ssl.SSLContext:
        """TLS with the head's certificate, for the dashboard's HTTPS (Python's ssl reads its key from a file)."""
        if self.folder is None:
            raise ValueError("this HeadTLS was not loaded from a folder")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.folder / SERVER_CHAIN, self.folder / SERVER_KEY)
        return context

    @classmethod
    def load_or_create(cls, folder: Path, names: Iterable[str]) -> HeadTLS:
        """The CA is made once and kept (agents pin it); the server certificate is made again when missing, near its
        end, or not naming every one of `names` (a new advertise address)."""
        wanted = sorted({n for n in names if n and n not in ("0.0.0.0", "::")})
        ca_path, ca_key_path = folder / "ca.pem", folder / "ca.key"
        if not (ca_path.exists() and ca_key_path.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Farm head CA")])
            ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                  .serial_number(x509.random_serial_number()).not_valid_before(_now() - datetime.timedelta(hours=1))
                  .not_valid_after(_now() + datetime.timedelta(days=CA_DAYS))
                  .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                  .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                               content_commitment=False, key_encipherment=False,
                                               data_encipherment=False, key_agreement=False, encipher_only=False,
                                               decipher_only=False), critical=True)
                  .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                  .sign(key, hashes.SHA256()))
            write_private(ca_key_path, _key_pem(key))
            write_private(ca_path, _cert_pem(ca))
        ca_pem, ca_key_pem = ca_path.read_bytes(), ca_key_path.read_bytes()
        server_path, server_key_path = folder / SERVER_CHAIN, folder / SERVER_KEY
        if not (server_key_path.exists() and server_path.exists()
                and _still_good(server_path.read_bytes(), ca_pem, wanted)):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _issue(ca_pem, ca_key_pem, "Farm head", key.public_key(), ExtendedKeyUsageOID.SERVER_AUTH,
                          SERVER_DAYS, wanted)
            write_private(server_key_path, _key_pem(key))
            write_private(server_path, _cert_pem(cert) + ca_pem)
        return cls(ca_pem=ca_pem, ca_key_pem=ca_key_pem, server_chain_pem=server_path.read_bytes(),
                   server_key_pem=server_key_path.read_bytes(), folder=folder)

    def sign_node(self, csr_pem: bytes, node_id: str) -> bytes:
        """A client certificate for `node_id` over the CSR's key: the subject is the head's choice, not the CSR's."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError:
            raise UserError("the certificate signing request is not valid PEM") from None
        if not csr.is_signature_valid:
            raise UserError("the certificate signing request's signature does not verify")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise UserError("the certificate signing request must be for an EC key")
        return _cert_pem(_issue(self.ca_pem, self.ca_key_pem, node_id, public_key, ExtendedKeyUsageOID.CLIENT_AUTH,
                                NODE_DAYS, []))


def _still_good(chain_pem: bytes, ca_pem: bytes, names: list[str]) -> bool:
    """The server certificate is of this CA (a CA adopted from a Secret replaces the first one), far from its end,
    and names every name."""
    cert = x509.load_pem_x509_certificate(chain_pem)
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_WITHIN_DAYS):
        return False
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return all(_san(n) in sans for n in names)


def _issue(ca_pem: bytes, ca_key_pem: bytes, common_name: str, public_key: ec.EllipticCurvePublicKey,
           usage: x509.ObjectIdentifier, days: int, names: list[str]) -> x509.Certificate:
    ca = x509.load_pem_x509_certificate(ca_pem)
    # EC when the head made the CA; RSA from Helm's genCA.
    ca_key = cast(CertificateIssuerPrivateKeyTypes, serialization.load_pem_private_key(ca_key_pem, password=None))
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca.subject).public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(_now() - datetime.timedelta(hours=1))
               .not_valid_after(_now() + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
                              critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


# ---- the client's side


def new_node_key() -> tuple[bytes, bytes]:
    """A node's private key and a CSR for it (the head fills in the subject), as PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)
