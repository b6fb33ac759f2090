"""`slo proxy --workers 2` against `--workers 1`, in the same run, where the proxy is the
bottleneck.

    uptime   # run alone, on a quiet machine
    python -m pytest tests/benchmarks/test_proxy_workers.py -o addopts="" -s -p no:cacheprovider

One fast upstream (tests/helpers/proxy_upstream.py, its own process) serves 32-token chat
streams (35 SSE events) 0.5 ms between tokens, so an engine is not what limits the rate: the
proxy in front of it is. The same load, 64 steady streams (`test_proxy_overhead`'s drive and
measure: the clients start spread over one stream's length, then each sends its next request
when its stream ends), runs through two proxies with the middleware on, one worker and two,
rounds interleaved. Measured: throughput in SSE events per second at the client, and the
proxy's CPU per event (every process of it). Goal (issue 29): two workers give at least 1.6x
one worker's throughput. Then each proxy is asked, on fresh connections, for `/metrics` and
`/slo`: every answer counts exactly the requests sent through it, as its records do.

On a machine with 4 CPUs or more the proxies are pinned to two of them (`taskset`) and the
clients and the upstream to the rest, so "two workers on two cores" is what is measured. With
fewer, everything shares the cores: the clients and the upstream then take part of what a
second worker would use, and the table says so.

`PROXY_WORKERS_ROUNDS` and `PROXY_WORKERS_PER_STREAM` shorten a run to prove it works
(their figures judge nothing: the goal is asserted only at full length).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import httpx

from middleware.intake.relay import relay_dir
from slo.cli.bench.server import free_port
from slo.sli import CATALOG
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.metric_samples import metric_values, total
from tests.helpers.proxy_load import (
    EVENTS_PER_STREAM,
    LOADS,
    Load,
    Measured,
    measure,
    process,
)

ROUNDS = int(os.environ.get("PROXY_WORKERS_ROUNDS", "3"))
PER_STREAM = int(os.environ.get("PROXY_WORKERS_PER_STREAM", "12"))
FULL_LENGTH = ROUNDS >= 3 and PER_STREAM >= 12
ITL_S = 0.0005  # the upstream's seconds between tokens: short, so the proxy is the bottleneck
LOAD = Load(LOADS["64 streams"].streams, PER_STREAM, ITL_S)
WORKERS = (1, 2)
GOAL = 1.6
PAGE = ROOT / "docs" / "benchmarks" / "proxy-workers.md"


def cpu_split() -> tuple[list[str], str]:
    """(the command prefix that pins a proxy to two CPUs, how the CPUs were shared); this
    process (the clients) and its children started later (the upstream) keep the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 4 or not shutil.which("taskset"):
        return [], f"unpinned: proxies, clients and upstream share {len(cpus)} CPUs"
    os.sched_setaffinity(0, cpus[2:])
    pinned = f"{cpus[0]},{cpus[1]}"
    others = len(cpus) - 2
    return ["taskset", "-c", pinned], (
        f"proxies pinned to CPUs {pinned}; clients and upstream on the {others} others"
    )


def process_tree(pid: int) -> list[int]:
    """The process and all its descendants (uvicorn's supervisor and its workers)."""
    pids, index = [pid], 0
    while index < len(pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pids[index]}/task").iterdir():
                pids += [int(child) for child in (task / "children").read_text().split()]
        index += 1
    return pids


def wait_for_workers(pid: int, workers: int, log: Path) -> list[int]:
    """Every process of the proxy, once each worker serves (it binds its span-relay socket at
    lifespan startup, in the directory the parent names on its log)."""
    deadline = time.monotonic() + 60
    while workers > 1:
        said = [line for line in log.read_text().splitlines() if "counted as one" in line]
        sockets = relay_dir(Path(said[0].rsplit(" in ", 1)[1].rstrip(")"))) if said else None
        if sockets is not None and len(list(sockets.glob("*.sock"))) == workers:
            break
        assert time.monotonic() < deadline, f"{workers} workers did not start: {log.read_text()}"
        time.sleep(0.2)
    return process_tree(pid)


def counts_add_up(base_url: str, db: Path, sent: int) -> dict[str, int]:
    """Records, and each of several `/metrics` and `/slo` answers, against the requests sent."""
    deadline = time.monotonic() + 30
    while True:
        with contextlib.closing(sqlite3.connect(db)) as connection:
            (recorded,) = connection.execute(
                "SELECT count(*) FROM llm_slo_request_records"
            ).fetchone()
        if recorded >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    close = {"connection": "close"}
    metrics, slo = set(), set()
    for _ in range(6):  # fresh connections: the answers come from either worker
        metrics.add(int(total(metric_values(base_url), CATALOG["requests"].metric)))
        status = httpx.get(base_url + "/slo", headers=close, timeout=10).json()
        slo.add(sum(tier["requests"] for tier in status["tiers"]))
    assert recorded == sent and metrics == {sent} and slo == {sent}, (sent, recorded, metrics, slo)
    return {"requests": sent, "records": recorded}


def test_two_workers_against_one(tmp_path: Path) -> None:
    load_at_start = load_average()
    pin, sharing = cpu_split()
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    upstream_cmd = [sys.executable, "-m", "tests.helpers.proxy_upstream"]
    upstream_cmd += ["--port", str(upstream_port)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(upstream_cmd, upstream_url + "/health", tmp_path / "up.log"))
        proxies: dict[int, tuple[int, list[int], Path]] = {}
        for workers in WORKERS:
            port, db = free_port(), tmp_path / f"records-{workers}.db"
            command = [*pin, sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url,
                       "--port", str(port), "--store", f"sqlite:///{db}",
                       "--workers", str(workers)]  # fmt: skip
            log = tmp_path / f"proxy-{workers}.log"
            child = stack.enter_context(process(command, f"http://127.0.0.1:{port}/health", log))
            proxies[workers] = (port, wait_for_workers(child.pid, workers, log), db)
        warm_up = Load(LOAD.streams, 1, 0.0, lockstep=True)
        runs: dict[int, list[Measured]] = {workers: [] for workers in WORKERS}
        for round_index in range(ROUNDS):
            order = WORKERS if round_index % 2 == 0 else WORKERS[::-1]
            for workers in order:
                port, pids, _db = proxies[workers]
                if round_index == 0:
                    measure(port, pids, warm_up)
                runs[workers].append(measure(port, pids, LOAD))
        checked = {}
        for workers, (port, _pids, db) in proxies.items():
            sent = LOAD.streams * (1 + ROUNDS * LOAD.per_stream)  # with the warm-up's
            checked[workers] = counts_add_up(f"http://127.0.0.1:{port}", db, sent)
    report = summarize(runs)
    print("\n" + json.dumps({"figures": report, "counts": checked, "cpus": sharing}, indent=2))
    write_page(report, load_at_start, sharing)
    if FULL_LENGTH:
        speedup = report["2 workers"]["speedup"]
        assert speedup >= GOAL, f"--workers 2 gives {speedup}x one worker's throughput"


def summarize(runs: dict[int, list[Measured]]) -> dict[str, dict[str, float]]:
    def median(workers: int, attribute: str) -> float:
        return statistics.median(getattr(run, attribute) for run in runs[workers])

    one = median(1, "events_per_s")
    return {
        f"{workers} worker{'s' if workers > 1 else ''}": {
            "events_per_s": round(median(workers, "events_per_s")),
            "speedup": round(median(workers, "events_per_s") / one, 2),
            "cpu_us_per_event": round(median(workers, "cpu_per_event_s") * 1e6, 2),
            "ttft_p50_ms": round(median(workers, "ttft_p50_s") * 1e3, 2),
        }
        for workers in runs
    }


def write_page(report: dict[str, dict[str, float]], load_at_start: str, sharing: str) -> None:
    rows = [
        [name, figures["events_per_s"], figures["speedup"], figures["cpu_us_per_event"],
         figures["ttft_p50_ms"]]
        for name, figures in report.items()
    ]  # fmt: skip
    header = ["slo proxy", "throughput (SSE events/s)", f"vs 1 worker (goal >= {GOAL})",
              "CPU per SSE event (us)", "TTFT p50 (ms)"]  # fmt: skip
    length = "" if FULL_LENGTH else f" A short run ({ROUNDS} rounds, {PER_STREAM} per stream)."
    text = "\n\n".join([
        "## --workers 2 against one worker, 64 steady streams",
        stamp(load_at_start),
        f"Medians over {ROUNDS} interleaved rounds of {LOAD.streams} streams x "
        f"{LOAD.per_stream} requests x {EVENTS_PER_STREAM} SSE events, {ITL_S * 1e3:g} ms "
        f"between tokens; {sharing}; records, /metrics and /slo checked to add up after the run. "
        "Command: `python -m pytest tests/benchmarks/test_proxy_workers.py -o addopts=\"\" -s "
        f"-p no:cacheprovider`.{length}",
        table(header, rows),
    ])  # fmt: skip
    write_section(PAGE, "slo proxy --workers: one port, every core", "proxy-workers", text)
