"""slo.cli.tls and slo.cli.security, file by file and flag by flag: every certificate that
cannot serve is refused before anything starts, in one line naming the file and the fix."""

from __future__ import annotations

import argparse
import datetime
import ssl
from pathlib import Path

import pytest

from slo.cli.security import add_security_flags, limit_addresses, ops_token
from slo.cli.tls import (
    ServerTls,
    certificate_validity,
    client_context,
    read_token_file,
    server_context,
    server_tls_from_args,
)
from slo.errors import UsageError
from tests.helpers.tls import Pki, issue

NOW = datetime.datetime.now(datetime.UTC)


def test_validity_is_read_from_the_der_without_cryptography(pki: Pki, tmp_path: Path) -> None:
    start = datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    cert, _, path, _ = issue(tmp_path, "later", None, None, not_before=start, days=3)
    der = ssl.PEM_cert_to_DER_cert(path.read_text())
    assert certificate_validity(der) == (cert.not_valid_before_utc, cert.not_valid_after_utc)
    with pytest.raises(ValueError):
        certificate_validity(der[:40])


def test_a_good_certificate_gives_a_context_with_the_minimum_version(pki: Pki) -> None:
    context = server_context(ServerTls(str(pki.server_cert), str(pki.server_key), None, "1.3"))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert context.verify_mode == ssl.CERT_NONE
    mtls = server_context(ServerTls(str(pki.server_cert), str(pki.server_key), str(pki.ca)))
    assert mtls.minimum_version == ssl.TLSVersion.TLSv1_2
    assert mtls.verify_mode == ssl.CERT_REQUIRED


def test_expired_and_not_yet_valid_name_the_file(pki: Pki, tmp_path: Path) -> None:
    old = NOW - datetime.timedelta(days=10)
    _, _, cert, key = issue(tmp_path, "old", None, None, not_before=old, days=2)
    with pytest.raises(UsageError, match=rf"--ssl-certfile {cert}: the certificate expired on"):
        server_context(ServerTls(str(cert), str(key)))
    _, _, cert, key = issue(
        tmp_path, "future", None, None, not_before=NOW + datetime.timedelta(days=1)
    )
    with pytest.raises(UsageError, match=rf"{cert}: the certificate is not valid before .*clock"):
        server_context(ServerTls(str(cert), str(key)))


def test_a_key_that_is_not_the_certificates(pki: Pki) -> None:
    with pytest.raises(UsageError, match=rf"--ssl-keyfile {pki.client_key} is not the key of"):
        server_context(ServerTls(str(pki.server_cert), str(pki.client_key)))


def test_files_that_are_not_what_they_should_be(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no PEM certificate in it"):
        server_context(ServerTls(str(pki.server_key), str(pki.server_key)))
    with pytest.raises(UsageError, match="no PEM private key in it"):
        server_context(ServerTls(str(pki.server_cert)))  # no key given, none in the cert file
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_text(
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
    )
    with pytest.raises(UsageError, match="the key is encrypted; decrypt it once"):
        server_context(ServerTls(str(pki.server_cert), str(encrypted)))
    with pytest.raises(UsageError, match="no such file"):
        server_context(ServerTls(str(tmp_path / "missing.pem")))
    with pytest.raises(UsageError, match="is a directory"):
        server_context(ServerTls(str(tmp_path)))


def test_the_certificate_and_key_in_one_file(pki: Pki, tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(pki.server_cert.read_bytes() + pki.server_key.read_bytes())
    assert server_context(ServerTls(str(both))).minimum_version == ssl.TLSVersion.TLSv1_2


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_security_flags(parser)
    return parser.parse_args(argv)


def test_tls_flags_without_a_certificate_are_a_mistake(pki: Pki) -> None:
    assert server_tls_from_args(_args()) is None
    with pytest.raises(UsageError, match="--ssl-ca-certs needs --ssl-certfile"):
        server_tls_from_args(_args("--ssl-ca-certs", str(pki.ca)))
    with pytest.raises(SystemExit):
        _args("--ssl-min-version", "1.1")  # argparse: not a choice


def test_client_context_verifies_by_default_and_insecure_is_explicit(pki: Pki) -> None:
    verified = client_context(ca_certs=str(pki.ca))
    assert verified.verify_mode == ssl.CERT_REQUIRED and verified.check_hostname
    insecure = client_context(insecure=True)
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    with pytest.raises(UsageError, match="--upstream-keyfile needs --upstream-certfile"):
        client_context(keyfile=str(pki.client_key))
    with pytest.raises(UsageError, match=r"--upstream-keyfile .* is not the key"):
        client_context(certfile=str(pki.client_cert), keyfile=str(pki.server_key))


def test_token_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    path.write_text("  abc123  \nsecond line ignored\n")
    assert read_token_file("--ops-token-file", str(path)) == "abc123"
    path.write_text("\n")
    with pytest.raises(UsageError, match=rf"--ops-token-file {path}: the file is empty"):
        read_token_file("--ops-token-file", str(path))
    path.write_text("two words\n")
    with pytest.raises(UsageError, match="printable ASCII without spaces"):
        read_token_file("--ops-token-file", str(path))
    path.write_text("from-env\n")
    monkeypatch.setenv("LLM_SLO_OPS_TOKEN_FILE", str(path))
    assert ops_token(_args()) == "from-env"
    monkeypatch.delenv("LLM_SLO_OPS_TOKEN_FILE")
    assert ops_token(_args()) is None


def test_address_limit_flags() -> None:
    def app() -> None: ...

    assert limit_addresses(app, _args()) is app  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--trusted-proxies is read only with"):
        limit_addresses(app, _args("--trusted-proxies", "10.0.0.0/8"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must be a positive number"):
        limit_addresses(app, _args("--ip-requests-per-minute", "0"))  # type: ignore[arg-type]
    nonsense = _args("--ip-requests-per-minute", "5", "--trusted-proxies", "nonsense")
    with pytest.raises(UsageError, match="'nonsense' is not an IP address"):
        limit_addresses(app, nonsense)  # type: ignore[arg-type]
