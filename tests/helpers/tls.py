"""Certificates made in the test: a CA, server and client certificates it signs, written as PEM
files (with `cryptography`); and waiting for an HTTPS server to answer."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    directory: Path

    def client_context(self, with_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def issue(
    directory: Path,
    name: str,
    ca_cert: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey | None,
    *,
    client: bool = False,
    not_before: datetime.datetime | None = None,
    days: float = 30,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path, Path]:
    """A certificate for `name` signed by the CA (self-signed CA when ca_cert is None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    is_ca = ca_cert is None
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name) if is_ca else ca_cert.subject)  # type: ignore[union-attr]
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if not is_ca:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if not client:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key if is_ca else ca_key, hashes.SHA256())  # type: ignore[arg-type]
    cert_path = _write_cert(cert, directory / f"{name}.crt")
    key_path = _write_key(key, directory / f"{name}.key")
    return cert, key, cert_path, key_path


def make_pki(directory: Path, prefix: str = "") -> Pki:
    """A fresh CA with one server certificate (localhost, 127.0.0.1) and one client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key, ca_path, _ = issue(directory, f"{prefix}ca", None, None, days=60)
    _, _, server_cert, server_key = issue(directory, f"{prefix}server", ca_cert, ca_key)
    _, _, client_cert, client_key = issue(
        directory, f"{prefix}client", ca_cert, ca_key, client=True
    )
    return Pki(ca_path, server_cert, server_key, client_cert, client_key, directory)


def wait_until_https_ready(
    url: str, verify: ssl.SSLContext, timeout_s: float = 60.0, process: object = None
) -> None:
    """Return once `url` answers (any status: 401 counts as up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        poll = getattr(process, "poll", None)
        if poll is not None and poll() is not None:
            raise RuntimeError(f"server exited with {poll()} before it was ready")
        try:
            httpx.get(url, verify=verify, timeout=2)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {url}") from None
            time.sleep(0.1)
