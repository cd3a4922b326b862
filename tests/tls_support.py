"""A self-signed certificate for the tests that serve or present TLS (the gateway's HTTPS, the
Kafka clients' mTLS files)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import WaitTimeoutError, wait_for
from tidegate.cli.procs import Child

__all__ = ["self_signed", "wait_https"]


def self_signed(directory: Path, password: bytes) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, encrypted with `password`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidegate-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password),
        )
    )
    return certfile, keyfile


def wait_https(url: str, child: Child, trust: ssl.SSLContext) -> None:
    """Poll `url` over HTTPS until it answers 200; on failure, say what the gateway logged."""

    def ready() -> bool:
        assert child.process.poll() is None, f"{child.name} exited:\n{child.tail()}"
        return httpx.get(url, verify=trust, timeout=2).status_code == 200

    try:
        # Until it listens, connecting fails (the last such error is in the timeout's message).
        wait_for(ready, timeout=120, what=url, retry_on=(httpx.TransportError,))
    except WaitTimeoutError as exc:
        raise WaitTimeoutError(f"{exc}\n{child.tail()}") from None
