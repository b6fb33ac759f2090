"""TLS for the CLI's listeners and clients: certificates checked before anything starts.

A certificate that cannot serve (unreadable, not PEM, expired, not yet valid, or not the
key's) is one line naming the file and the fix, raised as `UsageError` before the engine
loads: a traceback from deep in uvicorn's startup, after a minute of warm-up, is the
alternative. The contexts are built here, once, from Python's secure defaults
(`ssl.create_default_context`: no SSLv3, no compression, OpenSSL's default cipher list), with
the minimum protocol version set on the context itself: uvicorn has no flag for it (its
`ssl_version` picks a protocol constant, its `ssl_ciphers` only the TLS 1.2 cipher list).
"""

from __future__ import annotations

import argparse
import datetime
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slo.cli.common.flags import add_pem_flag
from slo.errors import UsageError

_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----")
MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True, slots=True)
class ServerTls:
    """What `slo serve` / `slo proxy` were asked to serve TLS with."""

    certfile: str
    keyfile: str | None = None
    ca_certs: str | None = None  # given: clients must present a certificate it signed (mTLS)
    min_version: str = "1.2"


def add_server_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (see docs/security.md)")
    add_pem_flag(group, "--ssl-certfile", "serve HTTPS with this certificate (chain), leaf first")
    add_pem_flag(
        group,
        "--ssl-keyfile",
        "the certificate's private key, unencrypted (default: read from --ssl-certfile)",
    )
    add_pem_flag(
        group,
        "--ssl-ca-certs",
        "mutual TLS: every client must present a certificate signed by one of these CAs",
    )
    group.add_argument(
        "--ssl-min-version",
        choices=sorted(MIN_VERSIONS),
        default="1.2",
        help="oldest TLS version accepted (default: %(default)s)",
    )


def server_tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    certfile: str | None = args.ssl_certfile
    if certfile is None:
        for flag in ("ssl_keyfile", "ssl_ca_certs"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise UsageError(
                    f"{name} needs --ssl-certfile too: TLS is served only with a certificate"
                )
        return None
    return ServerTls(certfile, args.ssl_keyfile, args.ssl_ca_certs, args.ssl_min_version)


def server_context(tls: ServerTls, now: datetime.datetime | None = None) -> ssl.SSLContext:
    """The listener's context, every file checked first (UsageError names the one at fault)."""
    check_certificate_file("--ssl-certfile", tls.certfile, now)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MIN_VERSIONS[tls.min_version]
    _load_chain(context, "--ssl-certfile", tls.certfile, tls.keyfile or tls.certfile)
    context.set_alpn_protocols(["http/1.1"])
    if tls.ca_certs is not None:
        _load_cas(context, "--ssl-ca-certs", tls.ca_certs, now)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    *,
    ca_certs: str | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    insecure: bool = False,
    flag_prefix: str = "--upstream",
    ca_flag: str | None = None,
) -> ssl.SSLContext:
    """A context for reaching an HTTPS server: verified against the system's CAs, or `ca_certs`;
    `certfile`/`keyfile` present a client certificate (mTLS); `insecure` verifies nothing."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_certs is not None:
        _load_cas(context, ca_flag or f"{flag_prefix}-ca-certs", ca_certs, None)
    if certfile is not None:
        check_certificate_file(f"{flag_prefix}-certfile", certfile, None)
        _load_chain(context, f"{flag_prefix}-certfile", certfile, keyfile or certfile)
    elif keyfile is not None:
        raise UsageError(f"{flag_prefix}-keyfile needs {flag_prefix}-certfile too")
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def read_token_file(flag: str, path: str) -> str:
    """A bearer token from a file (first line, whitespace stripped); never from a flag's value,
    which `ps` shows to every user of the machine."""
    text = _read(flag, path).decode("utf-8", "replace")
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise UsageError(f"{flag} {path}: the file is empty; write the token on its first line")
    if any(ord(ch) < 33 or ord(ch) > 126 for ch in token):
        raise UsageError(
            f"{flag} {path}: the token must be printable ASCII without spaces "
            f"(e.g. `openssl rand -hex 32 > {path}`)"
        )
    return token


def check_certificate_file(flag: str, path: str, now: datetime.datetime | None) -> None:
    """Readable PEM, at least one certificate, the first (the leaf) valid now."""
    text = _read(flag, path).decode("latin-1")
    blocks = _PEM_CERT.findall(text)
    if not blocks:
        raise UsageError(
            f"{flag} {path}: no PEM certificate in it (expected '-----BEGIN CERTIFICATE-----'); "
            "give the certificate file, not the key"
        )
    try:
        not_before, not_after = certificate_validity(ssl.PEM_cert_to_DER_cert(blocks[0]))
    except ValueError:
        raise UsageError(
            f"{flag} {path}: the first certificate is not valid DER inside its PEM armour; "
            "export it again"
        ) from None
    now = now or datetime.datetime.now(datetime.UTC)
    if not_after < now:
        day = not_after.date().isoformat()
        raise UsageError(f"{flag} {path}: the certificate expired on {day}; renew it and restart")
    if not_before > now:
        when = not_before.isoformat(timespec="seconds")
        raise UsageError(
            f"{flag} {path}: the certificate is not valid before {when}; "
            "check this machine's clock or reissue it"
        )


def certificate_validity(der: bytes) -> tuple[datetime.datetime, datetime.datetime]:
    """(notBefore, notAfter) of a DER X.509 certificate, read with the standard library only
    (cryptography is not a dependency of the core install; `ssl` decodes no leaf for us)."""
    tbs, _ = _der_item(_der_item(der, 0x30)[0], 0x30)
    offset = 0
    if tbs[:1] == b"\xa0":  # [0] version, present from X.509 v2 on
        offset = _der_skip(tbs, offset)
    for _ in range(3):  # serial number, signature algorithm, issuer
        offset = _der_skip(tbs, offset)
    validity, _ = _der_item(tbs[offset:], 0x30)
    not_before, rest = _der_time(validity)
    not_after, _ = _der_time(rest)
    return not_before, not_after


def _der_header(data: bytes) -> tuple[int, int, int]:
    """(tag, header length, content length) of the DER item at the start of `data`."""
    if len(data) < 2:
        raise ValueError("truncated DER")
    tag, length = data[0], data[1]
    if length < 0x80:
        return tag, 2, length
    size = length & 0x7F
    if size == 0 or size > 4 or len(data) < 2 + size:
        raise ValueError("bad DER length")
    return tag, 2 + size, int.from_bytes(data[2 : 2 + size], "big")


def _der_item(data: bytes, tag: int) -> tuple[bytes, bytes]:
    """(content, rest) of the item at the start of `data`, which must carry `tag`."""
    found, header, length = _der_header(data)
    if found != tag or len(data) < header + length:
        raise ValueError(f"expected DER tag {tag:#x}, got {found:#x}")
    return data[header : header + length], data[header + length :]


def _der_skip(data: bytes, offset: int) -> int:
    _, header, length = _der_header(data[offset:])
    return offset + header + length


def _der_time(data: bytes) -> tuple[datetime.datetime, bytes]:
    tag = data[:1]
    content, rest = _der_item(data, tag[0] if tag else 0)
    text = content.decode("ascii").rstrip("Z")
    if tag == b"\x17":  # UTCTime: YYMMDDHHMMSS, years 50-99 are 19xx (RFC 5280)
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != b"\x18":  # GeneralizedTime: YYYYMMDDHHMMSS
        raise ValueError("expected a UTCTime or GeneralizedTime")
    moment = datetime.datetime.strptime(text[:14], "%Y%m%d%H%M%S")
    return moment.replace(tzinfo=datetime.UTC), rest


def _load_chain(context: ssl.SSLContext, flag: str, certfile: str, keyfile: str) -> None:
    key_flag = flag.replace("certfile", "keyfile") if keyfile != certfile else flag
    key_text = _read(key_flag, keyfile).decode("latin-1")
    if "ENCRYPTED" in key_text:
        raise UsageError(
            f"{key_flag} {keyfile}: the key is encrypted; "
            f"decrypt it once (`openssl pkey -in {keyfile} -out key.pem`) "
            "and keep that file readable by this user only"
        )
    if "PRIVATE KEY-----" not in key_text:
        raise UsageError(
            f"{key_flag} {keyfile}: no PEM private key in it "
            "(expected '-----BEGIN PRIVATE KEY-----'); give the key with --ssl-keyfile"
        )
    try:
        # The callback answers any password prompt: a key that still wants one fails instead
        # of waiting on a terminal that a service does not have.
        context.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise UsageError(
                f"{key_flag} {keyfile} is not the key of the certificate in {flag} {certfile}; "
                "give the key it was issued for"
            ) from None
        raise UsageError(
            f"{flag} {certfile}: OpenSSL refused the certificate and key "
            f"({error.reason or error}); check that both are PEM and belong together"
        ) from None


def _load_cas(context: ssl.SSLContext, flag: str, path: str, now: datetime.datetime | None) -> None:
    check_certificate_file(flag, path, now)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as error:
        raise UsageError(
            f"{flag} {path}: OpenSSL refused the CA certificates ({error.reason}); "
            "give PEM CA certificates"
        ) from None


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file; check the path") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {path}: is a directory; give the file") from None
    except PermissionError:
        raise UsageError(
            f"{flag} {path}: permission denied; "
            "make it readable by this user (e.g. chmod 640 and group of the service)"
        ) from None
    except OSError as error:
        raise UsageError(
            f"{flag} {path}: cannot read it ({error.strerror}); check the file"
        ) from None


def uvicorn_config(context: ssl.SSLContext | None, app: Any, **options: Any) -> Any:
    """A `uvicorn.Config` that serves with `context` (None: plain HTTP). uvicorn builds its own
    context from its ssl_* options in `load()`, and none of them sets a minimum version;
    putting ours in place after its `load()` works on every uvicorn this project allows."""
    import uvicorn

    class _Config(uvicorn.Config):
        def load(self) -> None:
            super().load()
            self.ssl = context

    return _Config(app, **options)
