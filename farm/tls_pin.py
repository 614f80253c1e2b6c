"""The client's side of pinning the head's CA, with the standard library only: the hash `--ca-hash` carries (and the
join line that carries it), and fetching the CA off a TLS handshake and checking it against that hash.

Kept apart from farm.tls on purpose: the agent daemon lives for days and imports this (as does the `farm` CLI, which
an installed agent service runs in the foreground), and `cryptography`, which farm.tls needs to make keys and
certificates, would cost it ~15 MB resident. The agent makes its key and CSR in a
short-lived child process (`python -m farm_agent --csr KEY_FILE`) instead.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl

from farm.core.errors import AuthError, HeadUnavailableError, UserError

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def join_command(address: str, token: str, ca_hash: str) -> str:
    """What joins a machine: the head, a join token, and the hash of the head's CA for the agent to pin. The token
    goes in the environment (/proc/PID/environ is its user's alone), not on the command line, which every user of
    the machine reads in `ps`."""
    trust = f"--ca-hash {ca_hash}" if ca_hash else "--insecure"
    return f"FARM_JOIN_TOKEN={token} farm agent start --head {address} {trust}"


def ca_hash(ca_pem: bytes) -> str:
    """`sha256:<hex>` of the CA certificate's DER: what `--ca-hash` pins. The first certificate of the PEM counts
    (as cryptography's loader reads it); ValueError when there is none or it is not base64."""
    first = _PEM_CERTIFICATE.search(ca_pem)
    if first is None:
        raise ValueError("no PEM certificate (-----BEGIN CERTIFICATE-----) found")
    der = ssl.PEM_cert_to_DER_cert(first.group().decode("ascii"))  # binascii.Error (a ValueError) on bad base64
    if not der.startswith(b"\x30"):  # a DER certificate is a SEQUENCE
        raise ValueError("the PEM certificate's content is not DER")
    return "sha256:" + hashlib.sha256(der).hexdigest()


def parse_ca_hash(value: str) -> str:
    """Check a `--ca-hash` value's form; return it in lower case."""
    algorithm, _, digest = value.strip().lower().partition(":")
    if algorithm != "sha256" or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UserError(f"--ca-hash {value!r}: expected sha256:<64 hex digits>, as `farm head start` prints it")
    return f"{algorithm}:{digest}"


def fetch_ca(address: str, expected_hash: str, timeout: float = 10.0) -> bytes:
    """The head's CA certificate, read off a TLS handshake that verifies nothing, then pinned: it is returned only
    when its hash is `expected_hash`. Everything after this verifies the head against it."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # nothing to verify against yet: the pin below is the check
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host.strip("[]")) as tls:
            chain = _unverified_chain(tls)
    except (OSError, ValueError) as exc:
        raise HeadUnavailableError(f"cannot fetch the head's CA from {address}: {exc}") from None
    for der in chain:
        if _der_hash(der) == expected_hash:
            return ssl.DER_cert_to_PEM_cert(der).encode()
    raise AuthError(f"the head at {address} did not present the CA of --ca-hash {expected_hash} "
                    f"(it presented {', '.join(_der_hash(d) for d in chain)})")


def _der_hash(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _unverified_chain(tls: ssl.SSLSocket) -> list[bytes]:
    """The certificates the peer sent, as DER: public from Python 3.13, a private method of the same name before."""
    public = getattr(tls, "get_unverified_chain", None)
    # _sslobj: typeshed does not declare the private attribute
    chain = public() if public is not None else tls._sslobj.get_unverified_chain()  # type: ignore[attr-defined]
    return [c if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER) for c in chain or []]  # type: ignore[attr-defined]
