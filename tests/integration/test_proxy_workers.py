"""`slo proxy --workers 2` counts as one proxy: in front of the vLLM stand-in (its request spans
exported through the real OTLP/HTTP exporter, over the one connection it keeps, so they reach
one worker), 120 concurrent streams on fresh connections spread over both workers. Each request
has one record, joined to its span (relayed to the worker whose request it is), and every
answer of `/metrics` and `/slo`, from either worker, counts every worker's requests."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from middleware.intake.relay import relay_dir
from slo.cli.bench.server import free_port, stop_process
from slo.sli import CATALOG
from tests.helpers.metric_samples import metric_values, total
from tests.helpers.polling import wait_for, wait_until, wait_until_ready
from tests.helpers.record_rows import records
from tests.helpers.standin_process import standin_server

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

QUEUE_S, PREFILL_S, DECODE_S, TOKENS = 0.04, 0.03, 0.004, 8
STREAMS = 120


@contextlib.contextmanager
def proxy_workers(port: int, upstream_url: str, db: Path) -> Iterator[tuple[str, Path]]:
    """`slo proxy --workers 2`: (its URL, the private directory it made for its workers)."""
    command = [sys.executable, "-u", "-m", "slo.cli", "proxy", "--workers", "2",
               "--upstream", upstream_url, "--port", str(port), "--store", f"sqlite:///{db}",
               "--model", "standin", "--upstream-metrics", "off", "--engine-spans", "always",
               "--engine-span-wait", "15"]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    lines = []
    try:
        for line in child.stdout:  # the parent says where its workers meet before they start
            lines.append(line)
            if line.startswith("2 workers"):
                break
        assert lines and lines[-1].startswith("2 workers"), "".join(lines)
        directory = Path(lines[-1].rsplit(" in ", 1)[1].rstrip(")\n"))
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(base_url + "/metrics", process=child)
        # Both workers serving: each binds its relay socket at lifespan startup, just before
        # it accepts (one answering is not enough: the other may still be importing).
        wait_for(lambda: len(list(relay_dir(directory).glob("*.sock"))) == 2)
        yield base_url, directory
    finally:
        stop_process(child)
        output = "".join(lines) + child.stdout.read()
        child.stdout.close()
        assert child.returncode == 0, output


async def stream_all(base_url: str, count: int) -> list[int]:
    """`count` concurrent chat streams, each on a connection of its own (so the kernel hands
    them to either worker); the number of content events each got."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one(index: int) -> int:
            body = {"model": "m", "messages": [{"role": "user", "content": f"hi {index}"}],
                    "max_tokens": TOKENS, "stream": True}  # fmt: skip
            async with client.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                text = (await r.aread()).decode()
            return text.count('"content":"') - text.count('"content":""')

        return await asyncio.gather(*(one(index) for index in range(count)))


def requests_per_worker(directory: Path, scratch: Path) -> dict[str, float]:
    """Each worker's own request count, from its own files of the metrics directory."""
    name = CATALOG["requests"].metric
    counts = {}
    pids = {path.stem.rsplit("_", 1)[1] for path in directory.glob("counter_*.db")}
    for pid in pids:
        alone = scratch / f"worker-{pid}"
        alone.mkdir()
        for path in directory.glob(f"*_{pid}.db"):
            shutil.copy(path, alone)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        counts[pid] = sum(
            sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == name
        )
    return {pid: count for pid, count in counts.items() if count}


def join_counts(base_url: str) -> str:
    """The join's counters, as one /metrics answer sums them (what a timeout should say)."""
    values = metric_values(base_url)
    names = ("engine_spans_joined", "engine_spans_unmatched", "engine_span_waits_expired")
    return ", ".join(f"{name} {total(values, CATALOG[name].metric):g}" for name in names)


def slo_requests(base_url: str) -> int:
    status = httpx.get(base_url + "/slo", headers={"connection": "close"}, timeout=10).json()
    return sum(tier["requests"] for tier in status["tiers"])


def test_two_workers_count_as_one(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "records.db"
    with standin_server(
        "vllm", tmp_path, queue_s=QUEUE_S, prefill_s=PREFILL_S, decode_s=DECODE_S,
        otlp_url=f"http://127.0.0.1:{port}/v1/traces", export_delay_max_s=3, seed=11,
    ) as upstream, proxy_workers(port, upstream, db) as (base_url, directory):  # fmt: skip
        assert asyncio.run(stream_all(base_url, STREAMS)) == [TOKENS] * STREAMS
        joined = CATALOG["engine_spans_joined"].metric
        wait_until(
            lambda: total(metric_values(base_url), joined) >= STREAMS,
            60,
            "every stream's engine span to be joined",
            on_timeout=lambda: join_counts(base_url),
        )
        per_worker = requests_per_worker(directory, tmp_path)
        assert len(per_worker) == 2, f"one worker took every request: {per_worker}"
        assert sum(per_worker.values()) == STREAMS
        wait_for(lambda: len(records(db)) >= STREAMS)  # the writers' batches land
        # Asked again and again, on fresh connections: whichever worker answers adds up both.
        answers = [(metric_values(base_url), slo_requests(base_url)) for _ in range(8)]
    assert not directory.exists(), "the private metrics directory outlived the proxy"
    rows = records(db)
    assert len(rows) == STREAMS and len({row["request_id"] for row in rows}) == STREAMS
    for values, slo_count in answers:
        assert total(values, CATALOG["requests"].metric) == len(rows)
        assert slo_count == len(rows)
        assert total(values, joined) == STREAMS
        assert total(values, CATALOG["engine_spans_unmatched"].metric) == 0
        assert total(values, CATALOG["engine_span_waits_expired"].metric) == 0
    decode_s = DECODE_S * (TOKENS - 1)
    for row in rows:
        assert row["outcome"] == "ok" and row["queue_prefill_s"] is None, row
        assert math.isclose(row["queue_s"], QUEUE_S, abs_tol=1e-3), row  # type: ignore[arg-type]
        assert math.isclose(row["prefill_s"], PREFILL_S, abs_tol=1e-3), row  # type: ignore[arg-type]
        assert math.isclose(row["decode_s"], decode_s, abs_tol=1e-3), row  # type: ignore[arg-type]


MISSING_DIR = {"PROMETHEUS_MULTIPROC_DIR": "/nonexistent/metrics"}


@pytest.mark.parametrize(
    ("flags", "env", "says"),
    [
        (["--workers", "0"], {}, "--workers must be a whole number of at least 1 or auto, got '0'"),
        (["--workers", "two"], {}, "--workers must be a whole number of at least 1 or auto"),
        (["--workers", "2", "--upstream", "ftp://127.0.0.1:1"], {}, "--upstream"),
        (["--workers", "2", "--spec", "/nonexistent/slo.yaml"], {}, "/nonexistent/slo.yaml"),
        (["--workers", "2"], MISSING_DIR, "PROMETHEUS_MULTIPROC_DIR=/nonexistent/metrics"),
    ],
)
def test_a_mistake_is_one_line_before_any_worker_starts(
    tmp_path: Path, flags: list[str], env: dict[str, str], says: str
) -> None:
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", "http://127.0.0.1:1",
               "--port", str(free_port()), "--store", f"sqlite:///{tmp_path / 'r.db'}",
               "--upstream-metrics", "off", "--provider-name", "vllm", *flags]  # fmt: skip
    environment = {**os.environ, **env}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, env=environment
    )
    assert done.returncode != 0
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "workers, counted as one" not in done.stdout


def test_each_worker_serves_tls_with_the_flags_context(tmp_path: Path) -> None:
    """Each worker makes the listener's TLS context from the same flags (min version 1.2 by
    default): HTTPS on fresh connections reaches both, and a TLS 1.1 client is refused."""
    from tests.helpers.binaries import binary
    from tests.helpers.https_upstream import tls_upstream
    from tests.helpers.proxy_process import tls_proxy
    from tests.helpers.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    db = tmp_path / "records.db"
    with tls_upstream(pki) as upstream, tls_proxy(
        pki, upstream, db, "--upstream-ca-certs", str(pki.ca), "--workers", "2"
    ) as url:  # fmt: skip
        context = pki.client_context(with_client_cert=True)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(20):
            with httpx.Client(verify=context) as client:  # a connection of its own
                assert client.post(url + "/v1/chat/completions", json=body).status_code == 200
        port = int(url.rsplit(":", 1)[1])
        for _ in range(6):  # fresh connections: both workers asked
            # SECLEVEL=0 lets this client offer TLS 1.1 at all; the refusal must be the server's.
            refused = subprocess.run(
                [binary("openssl"), "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_1",
                 "-cipher", "DEFAULT@SECLEVEL=0"],
                input="", capture_output=True, text=True, timeout=20, check=False,
            )  # fmt: skip
            assert refused.returncode != 0 and "Cipher is (NONE)" in refused.stdout
        wait_for(lambda: len(records(db)) == 20)


@pytest.mark.parametrize(
    ("files", "expected_quota"),
    [
        ({"cpu.max": "250000 100000\n"}, 2.5),  # cgroup v2: a pod limit of 2500m
        ({"cpu.max": "max 100000\n"}, None),  # no limit
        ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_auto_fits_the_cpu_limit(
    tmp_path: Path, files: dict[str, str], expected_quota: float | None
) -> None:
    from slo.cli.proxy.workers import cpu_quota, resolve_workers

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(tmp_path) == expected_quota
    cpus = len(os.sched_getaffinity(0))
    limit = cpus if expected_quota is None else max(1, min(cpus, int(expected_quota)))
    assert resolve_workers("auto", tmp_path) == limit
    assert resolve_workers("3", tmp_path) == 3


def test_sigterm_lets_every_workers_streams_finish_and_records_them(tmp_path: Path) -> None:
    """SIGTERM to `slo proxy --workers 2` mid-stream: each worker drains its streams (they end
    whole) and flushes their records, and the private directory goes."""
    from tests.helpers.proxy_upstream import OpenAIUpstream
    from tests.helpers.servers import uvicorn_thread

    db, port = tmp_path / "records.db", free_port()
    with uvicorn_thread(OpenAIUpstream()) as upstream_url:
        proxied = proxy_workers(port, upstream_url, db)
        base_url, directory = proxied.__enter__()

        async def streams() -> list[int]:
            limits = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:

                async def one() -> int:
                    body = {"model": "m", "prompt": "hi", "max_tokens": 20, "stream": True}
                    headers = {"x-test-itl-s": "0.1"}  # 2 s a stream
                    url = base_url + "/v1/completions"
                    async with client.stream("POST", url, json=body, headers=headers) as reply:
                        return (await reply.aread()).count(b'"text": " t')

                return await asyncio.gather(*(one() for _ in range(16)))

        async def stop_midway() -> list[int]:
            running = asyncio.ensure_future(streams())
            await asyncio.sleep(1.0)
            # SIGTERM, then wait for the exit (code 0), off this loop: the streams go on
            await asyncio.to_thread(proxied.__exit__, None, None, None)
            return await running

        events = asyncio.run(stop_midway())
    assert events == [20] * 16
    assert len(records(db)) == 16
    assert not directory.exists()
