"""`slo proxy --otlp-grpc HOST:PORT`: the flag becomes the middleware's `engine_spans.otlp_grpc`
with the proxy's own token and TLS files; its mistakes (an address without a port, a port
already taken) are one line each; the workers of `--workers N` share the port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the OTLP/gRPC intake needs grpcio (llm-slo[grpc])")

from slo.cli import build_parser
from slo.cli.common.middleware import middleware_config
from slo.cli.proxy.app import _grpc_access, build
from slo.errors import UsageError

UPSTREAM = ["proxy", "--upstream", "http://127.0.0.1:1"]


def test_the_flag_and_the_proxys_token_and_tls_become_the_config() -> None:
    args = build_parser("proxy").parse_args(
        [*UPSTREAM, "--otlp-grpc", "0.0.0.0:4317", "--ssl-certfile", "server.pem"]
    )
    config = middleware_config(args, **_grpc_access(args, "s3cret"))
    spans = config.engine_spans
    assert (spans.otlp_grpc, spans.otlp_grpc_token) == ("0.0.0.0:4317", "s3cret")
    assert (spans.otlp_grpc_certfile, spans.otlp_grpc_keyfile) == ("server.pem", None)
    plain = build_parser("proxy").parse_args(UPSTREAM)
    assert middleware_config(plain, **_grpc_access(plain, "s3cret")).engine_spans.otlp_grpc is None


def test_the_proxy_serves_it_and_says_where(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = f"sqlite:///{tmp_path / 'records.db'}"
    args = build_parser("proxy").parse_args(
        [*UPSTREAM, "--store", store, "--otlp-grpc", f"127.0.0.1:{port}"]
    )
    built = build(args, None, None, listing=("vllm", []), scrape=False)
    try:
        assert built.middleware.otlp_grpc is not None
        assert built.middleware.otlp_grpc.port == port
        said = capsys.readouterr()
        assert f"OTLP/gRPC span intake: 127.0.0.1:{port}\n" in said.out
        assert "takes spans from anyone" in said.err  # no --ops-token-file
        with pytest.raises(UsageError, match="--otlp-grpc: OTLP/gRPC intake: cannot listen"):
            build(args, None, None, listing=("vllm", []), scrape=False)  # the port is taken
    finally:
        built.close()


def test_its_address_wants_a_port() -> None:
    args = build_parser("proxy").parse_args([*UPSTREAM, "--otlp-grpc", "4317"])
    with pytest.raises(UsageError, match=r"--otlp-grpc: .*HOST:PORT"):
        build(args, None, None, listing=("vllm", []), scrape=False)


def test_the_workers_of_one_proxy_share_the_port(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = f"sqlite:///{tmp_path / 'records.db'}"
    args = build_parser("proxy").parse_args(
        [*UPSTREAM, "--store", store, "--otlp-grpc", f"127.0.0.1:{port}"]
    )
    workers = [
        build(args, None, None, listing=("vllm", []), scrape=False, worker=True) for _ in "ab"
    ]
    try:
        intakes = [built.middleware.otlp_grpc for built in workers]
        assert [None if i is None else (i.port, i.address) for i in intakes] == [
            (port, f"127.0.0.1:{port}")
        ] * 2
    finally:
        for built in workers:
            built.close()
