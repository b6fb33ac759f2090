"""The stand-in OpenAI server (tests/helpers/proxy_upstream.py) on HTTPS with the test's
certificates, optionally asking for a client certificate (mTLS)."""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Iterator

from slo.cli.bench.server import free_port
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.tls import Pki, wait_until_https_ready


@contextlib.contextmanager
def tls_upstream(pki: Pki, client_certificates: bool = False) -> Iterator[str]:
    """The stand-in OpenAI server on HTTPS (uvicorn's own ssl options), in a thread;
    `client_certificates`: it asks for one signed by the test's CA (mTLS)."""
    import uvicorn

    port = free_port()
    mtls = {"ssl_ca_certs": str(pki.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    config = uvicorn.Config(
        OpenAIUpstream(),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        ssl_certfile=str(pki.server_cert),
        ssl_keyfile=str(pki.server_key),
        **(mtls if client_certificates else {}),  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until_https_ready(url + "/health", pki.client_context(with_client_cert=True))
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
