"""The streamed load of the proxy benchmarks: one fast OpenAI-style upstream's 32-token chat
streams (role chunk, 32 text deltas, finish chunk, `[DONE]`: 35 SSE events) driven at a port
with raw HTTP/1.1 keep-alive connections, the client's TTFT (to the first text delta) and the
CPU the serving processes spent (every thread's time on CPU from /proc/PID/task/*/schedstat,
in ns), and the medians and ratios over interleaved rounds; nginx as the reverse proxy to
compare with (proxy_buffering off, HTTP/1.1 upstream keep-alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from middleware.proxy.client import UpstreamPool
from slo.cli.bench.server import stop_process
from tests.helpers.servers import wait_until_ready

TOKENS = 32
EVENTS_PER_STREAM = TOKENS + 3


@dataclass(frozen=True)
class Load:
    streams: int
    per_stream: int  # requests each stream sends, one after another
    itl_s: float  # the upstream's seconds between tokens
    lockstep: bool = False  # every stream starts at once (else spread over one stream's length)


LOADS = {
    "1 stream": Load(1, 120, 0.001),
    "64 streams": Load(64, 8, 0.010),
    "64 streams, lockstep": Load(64, 8, 0.010, lockstep=True),
}
ROUNDS = 3
# Issue 29's goal for CPU, named in the figures' key.
CPU_RATIO = 1.5  # CPU per SSE event against nginx's
CPU_RATIO_KEY = f"ratio slo/nginx (goal <= {CPU_RATIO})"


@dataclass
class Measured:
    ttft_s: list[float]
    events: int
    wall_s: float
    cpu_s: float

    @property
    def ttft_p50_s(self) -> float:
        return statistics.median(self.ttft_s)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s

    @property
    def cpu_per_event_s(self) -> float:
        return self.cpu_s / self.events


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of every thread of these processes (schedstat: ns on CPU, not 10 ms ticks)."""
    total_ns = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that just ended
                total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


def process_tree(pid: int) -> list[int]:
    """The process and its children (nginx: master and worker)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(child) for child in (task / "children").read_text().split()]
    return pids


async def one_stream(pool: UpstreamPool, head: bytes, body: bytes) -> tuple[float, int]:
    connection = await pool.acquire()
    started = time.perf_counter()
    connection.send_request(head + body)
    ttft = None
    events = 0
    try:
        await connection.response_headers()
        assert connection.status == 200, connection.status
        while (piece := await connection.read()) is not None:
            if ttft is None and b'"content": " t' in piece:
                ttft = time.perf_counter() - started
            events += piece.count(b"data: ")
    finally:
        pool.release(connection)
    assert ttft is not None, "no text delta arrived"
    return ttft, events


async def drive(port: int, load: Load) -> Measured:
    streams, itl_s = load.streams, load.itl_s
    pool = UpstreamPool("127.0.0.1", port, max_connections=streams, read_timeout_s=60)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        | {"max_tokens": TOKENS}
    ).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\nx-llm-tier: premium\r\n"
        b"x-test-itl-s: %s\r\ncontent-length: %d\r\n\r\n" % (str(itl_s).encode(), len(body))
    )
    ttfts: list[float] = []
    events = 0

    stream_s = EVENTS_PER_STREAM * itl_s

    async def client(index: int) -> None:
        nonlocal events
        if not load.lockstep:
            await asyncio.sleep(stream_s * index / streams)
        for _ in range(load.per_stream):
            ttft, seen = await one_stream(pool, head, body)
            ttfts.append(ttft)
            events += seen

    started = time.perf_counter()
    await asyncio.gather(*(client(index) for index in range(streams)))
    wall_s = time.perf_counter() - started
    pool.close()
    return Measured(ttfts, events, wall_s, 0.0)


def measure(port: int, pids: list[int], load: Load) -> Measured:
    before = cpu_seconds(pids)
    result = asyncio.run(drive(port, load))
    result.cpu_s = cpu_seconds(pids) - before if pids else 0.0
    assert result.events == load.streams * load.per_stream * EVENTS_PER_STREAM, result.events
    return result


@contextlib.contextmanager
def process(command: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_ready(ready_url, process=child)
            yield child
        finally:
            stop_process(child)


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def summarize(runs: dict[str, list[Measured]]) -> dict[str, dict[str, float]]:
    """Medians over the rounds of each variant's figures, and the ratios the goals judge."""

    def median(name: str, attribute: str) -> float:
        return statistics.median(getattr(run, attribute) for run in runs[name])

    direct_ttft = median("direct", "ttft_p50_s")
    direct_rate = median("direct", "events_per_s")
    proxies = ("slo proxy", "nginx")
    cpu = {name: median(name, "cpu_per_event_s") * 1e6 for name in proxies}
    return {
        "ttft_p50_ms": {name: round(median(name, "ttft_p50_s") * 1e3, 3) for name in runs},
        "added_ttft_p50_ms": {
            name: round((median(name, "ttft_p50_s") - direct_ttft) * 1e3, 3) for name in proxies
        },
        "cpu_us_per_event": {
            **{name: round(value, 2) for name, value in cpu.items()},
            CPU_RATIO_KEY: round(cpu["slo proxy"] / cpu["nginx"], 2),
        },
        "events_per_s": {name: round(median(name, "events_per_s")) for name in runs},
        "throughput_vs_direct": {
            name: round(median(name, "events_per_s") / direct_rate, 3) for name in proxies
        },
    }
