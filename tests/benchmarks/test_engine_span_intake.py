"""`slo proxy` taking an engine's request spans (OTLP/HTTP at POST /v1/traces) while it proxies.

    uptime   # run alone, on a quiet machine: the figures below assume two cores to ourselves
    python -m pytest tests/benchmarks/test_engine_span_intake.py -o addopts="" -s \
        -p no:cacheprovider
    LLM_SLO_BENCH_SPAN_MINUTES=2 python -m pytest ...   # a shorter memory run

The proxy runs pinned to one core (taskset), and nginx, its peer, on the same core. On the other
core: the upstream (tests/helpers/proxy_upstream.py), this process (the clients), and an engine's
exporter (tests/benchmarks/otlp_span_sender.py): vLLM-shaped `llm_request` spans, OTLP/HTTP
protobuf, 512 per export as the SDK's BatchSpanProcessor sends them, 5,000 spans/s, every span
for a trace the proxy never saw (so each is held, then dropped and counted as unmatched).

test_span_intake_while_proxying: the 64 steady streams of tests/benchmarks/test_proxy_overhead.py
(its helpers, its load) against direct access, `slo proxy` and nginx, variants interleaved; each
round once with no spans and once while the exporter sends 5,000 spans/s; then the exporter
alone, back to back, for the proxy's capacity and CPU per span. Goals (issue 22): every export
answered 200 and every span counted (each dropped on arrival as unmatched: no request of ours
carries its trace); >= 5,000 spans/s taken; with spans flowing, today's proxy goals at 64
streams: added TTFT p50 <= 2x nginx's (floored at 0.5 ms) and CPU per SSE event <= 3x nginx's.

test_unmatched_span_memory_is_bounded: 5,000 spans/s of unknown traces for
LLM_SLO_BENCH_SPAN_MINUTES (default 10) minutes; the proxy's RSS every 10 s. Goal: flat, the max
over the last half within max(5%, 10 MiB) of the max over minutes 2-5 (the first 20% is warm-up).

Both write their tables to docs/benchmarks/engine-span-intake.md, stamped with commit and date.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slo.cli.bench.server import free_port
from tests.benchmarks.bench_record import ROOT, load_average, write_section
from tests.benchmarks.span_intake import (
    GOAL_SPANS_PER_S,
    MINUTES,
    RSS_EVERY_S,
    core_busy_s,
    expected_unmatched,
    exporter,
    intake_counts,
    on_core,
    pinned,
    rss_mib,
    servers,
    two_cores,
)
from tests.benchmarks.span_intake_page import intake_page, memory_page
from tests.conftest import require_or_skip
from tests.helpers.proxy_load import (
    LOADS,
    NGINX_CONF,
    ROUNDS,
    Load,
    Measured,
    cpu_seconds,
    drive,
    measure,
    process,
    process_tree,
    summarize,
)

PAGE = ROOT / "docs" / "benchmarks" / "engine-span-intake.md"
TITLE = "Engine span intake: `slo proxy` taking OTLP request spans"
STEADY = LOADS["64 streams"]
SETTLE_S = 2.0  # spans flow this long before streams are measured: the proxy holds its maximum
FLAT_OUT_S = 5.0  # the exporter alone, back to back: the proxy's capacity and CPU per span


@dataclass
class Phase:
    """One condition (spans flowing or not): every variant's rounds, and how much of the
    proxies' core other processes took meanwhile (this machine is not always ours alone: the
    figures are only as good as that share is small)."""

    core: int  # the proxies' core
    runs: dict[str, list[Measured]] = field(default_factory=dict)
    others_s: float = 0.0
    wall_s: float = 0.0

    def one_round(self, variants: dict[str, tuple[int, list[int]]], order: list[str]) -> None:
        ours = [pid for _port, pids in variants.values() for pid in pids]
        started, ours_before = time.perf_counter(), cpu_seconds(ours)
        busy_before = core_busy_s(self.core)
        for name in order:
            port, pids = variants[name]
            self.runs.setdefault(name, []).append(measure(port, pids, STEADY))
        ours_s = cpu_seconds(ours) - ours_before
        self.others_s += core_busy_s(self.core) - busy_before - ours_s
        self.wall_s += time.perf_counter() - started

    def summary(self) -> dict[str, Any]:
        return {
            **summarize(self.runs),
            "added_ttft_p99_ms": added_ttft_p99_ms(self.runs),
            "others_on_proxy_core": round(max(self.others_s, 0.0) / self.wall_s, 3),
        }


def combined(sent: list[dict[str, Any]]) -> dict[str, Any]:
    """The span sender's runs (one per round) as one: sums, and the worst latencies."""
    spans = sum(run["spans_acknowledged"] for run in sent)
    elapsed_s = sum(run["elapsed_s"] for run in sent)
    statuses: Counter[str] = Counter()
    for run in sent:
        statuses.update(run["statuses"])
    return {
        "offered_spans_per_s": sent[0]["offered_spans_per_s"],
        "exports": sum(run["exports"] for run in sent),
        "spans_acknowledged": spans,
        "statuses": dict(statuses),
        "elapsed_s": round(elapsed_s, 3),
        "achieved_spans_per_s": round(spans / elapsed_s, 1),
        "export_ms_p50": statistics.median(run["export_ms_p50"] for run in sent),
        **{key: max(run[key] for run in sent) for key in ("export_ms_p99", "export_ms_max")},
        "max_lag_ms": max(run["max_lag_ms"] for run in sent),
    }


def added_ttft_p99_ms(runs: dict[str, list[Measured]]) -> dict[str, float]:
    def p99(name: str) -> float:
        return statistics.median(statistics.quantiles(r.ttft_s, n=100)[98] for r in runs[name])

    return {name: round((p99(name) - p99("direct")) * 1e3, 3) for name in ("slo proxy", "nginx")}


@pytest.mark.timeout(1200)
def test_span_intake_while_proxying(tmp_path: Path) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        require_or_skip("nginx is not installed (apt-get install nginx-light): the CPU peer")
    core, other_core = two_cores()
    load_at_start = load_average()
    upstream_cmd, proxy_cmd, upstream_port, proxy_port = servers(tmp_path, core, other_core)
    nginx_port = free_port()
    (tmp_path / "nginx.conf").write_text(
        NGINX_CONF.format(tmp=tmp_path, upstream=upstream_port, port=nginx_port)
    )
    nginx_cmd = [nginx, "-e", str(tmp_path / "error.log"), "-p", str(tmp_path), "-c"]
    nginx_cmd = pinned(core, [*nginx_cmd, str(tmp_path / "nginx.conf")])
    with (
        on_core(other_core),
        process(upstream_cmd, f"http://127.0.0.1:{upstream_port}/health", tmp_path / "up.log"),
        process(proxy_cmd, f"http://127.0.0.1:{proxy_port}/health", tmp_path / "proxy.log") as px,
        process(nginx_cmd, f"http://127.0.0.1:{nginx_port}/health", tmp_path / "nginx.log") as ng,
    ):
        variants = {
            "direct": (upstream_port, []),
            "slo proxy": (proxy_port, [px.pid]),
            "nginx": (nginx_port, process_tree(ng.pid)),
        }
        warm_up = Load(STEADY.streams, 1, 0.0, lockstep=True)
        for port, _pids in variants.values():  # connections, caches, label children
            asyncio.run(drive(port, warm_up))
        # Rounds alternate between no spans and spans (the exporter started afresh each
        # round), so a change in what else this machine runs falls on both alike.
        quiet, busy = Phase(core), Phase(core)
        sent, names = [], list(variants)
        for round_index in range(ROUNDS):
            order = names[round_index:] + names[:round_index]
            quiet.one_round(variants, order)
            out = tmp_path / f"paced-{round_index}.json"
            with exporter(proxy_port, other_core, out, GOAL_SPANS_PER_S):
                time.sleep(SETTLE_S)
                busy.one_round(variants, order)
            sent.append(json.loads(out.read_text()))
        paced = combined(sent)
        cpu_before = cpu_seconds([px.pid])
        with exporter(proxy_port, other_core, tmp_path / "flat.json", 0, FLAT_OUT_S) as sender:
            sender.wait(timeout=FLAT_OUT_S + 60)
        flat = json.loads((tmp_path / "flat.json").read_text())
        flat["proxy_cpu_us_per_span"] = round(
            (cpu_seconds([px.pid]) - cpu_before) / max(flat["spans_acknowledged"], 1) * 1e6, 2
        )
        counts = intake_counts(proxy_port)
    report = {
        "no spans": quiet.summary(),
        "5,000 spans/s": busy.summary(),
        "spans paced": paced,
        "spans back to back": flat,
        "proxy /metrics": counts,
    }
    print("\n" + json.dumps(report, indent=2))
    goals = intake_goals(report)
    write_section(PAGE, TITLE, "intake-while-proxying", intake_page(report, goals, load_at_start))
    misses = [goal for goal, measured, limit, met in goals if not met]
    assert not misses, f"goals missed: {misses}"


def intake_goals(report: dict[str, Any]) -> list[tuple[str, float, float, bool]]:
    """(goal, measured, limit, met) for each goal of issue 22 this run judges."""
    paced, flat, counts = (
        report["spans paced"],
        report["spans back to back"],
        report["proxy /metrics"],
    )
    busy = report["5,000 spans/s"]
    sent = paced["spans_acknowledged"] + flat["spans_acknowledged"]
    exports = paced["exports"] + flat["exports"]
    answered = paced["statuses"].get("200", 0) + flat["statuses"].get("200", 0)
    unmatched = counts.get("llm_slo_engine_spans_unmatched_total", -1)
    added = busy["added_ttft_p50_ms"]["slo proxy"]
    # Today's goal at 64 streams (tests/benchmarks/test_proxy_overhead.py): at most 2x what
    # nginx adds, floored at 0.5 ms so that "2x" never judges noise.
    added_limit = 2 * max(busy["added_ttft_p50_ms"]["nginx"], 0.5)
    cpu_ratio = busy["cpu_us_per_event"]["ratio slo/nginx (goal <= 3)"]
    rate = paced["achieved_spans_per_s"]
    return [
        ("every export answered 200", answered, exports, answered == exports),
        (
            "every span counted: unmatched == sent (none of ours: dropped on arrival)",
            unmatched,
            expected_unmatched(sent),
            unmatched == expected_unmatched(sent),
        ),
        (
            "spans/s taken while proxying 64 streams >= 5,000",
            rate,
            GOAL_SPANS_PER_S,
            rate >= GOAL_SPANS_PER_S,
        ),
        (
            "added TTFT p50, 64 streams, with spans <= 2x nginx's (floor 0.5 ms)",
            added,
            added_limit,
            added <= added_limit,
        ),
        ("CPU per SSE event with spans <= 3x nginx's", cpu_ratio, 3.0, cpu_ratio <= 3.0),
    ]


def sample_while(sender: subprocess.Popen[bytes], pid: int, port: int) -> list[dict[str, float]]:
    """Every RSS_EVERY_S while the sender runs: minutes, RSS, CPU share, spans dropped."""
    series: list[dict[str, float]] = []
    started = time.perf_counter()
    cpu_then, at_then = cpu_seconds([pid]), started
    while sender.poll() is None:
        time.sleep(max(0.0, started + (len(series) + 1) * RSS_EVERY_S - time.perf_counter()))
        now, cpu_now = time.perf_counter(), cpu_seconds([pid])
        counts = intake_counts(port)
        series.append(
            {
                "minute": round((now - started) / 60, 3),
                "rss_mib": round(rss_mib(pid), 2),
                "cpu_share": round((cpu_now - cpu_then) / (now - at_then), 3),
                "unmatched": counts.get("llm_slo_engine_spans_unmatched_total", 0),
            }
        )
        cpu_then, at_then = cpu_now, now
    return series


@pytest.mark.timeout(int(MINUTES * 60) + 600)
def test_unmatched_span_memory_is_bounded(tmp_path: Path) -> None:
    core, other_core = two_cores()
    load_at_start = load_average()
    upstream_cmd, proxy_cmd, upstream_port, proxy_port = servers(tmp_path, core, other_core)
    with (
        on_core(other_core),
        process(upstream_cmd, f"http://127.0.0.1:{upstream_port}/health", tmp_path / "up.log"),
        process(proxy_cmd, f"http://127.0.0.1:{proxy_port}/health", tmp_path / "proxy.log") as px,
    ):
        rss_before = round(rss_mib(px.pid), 2)
        out = tmp_path / "paced.json"
        with exporter(proxy_port, other_core, out, GOAL_SPANS_PER_S, MINUTES * 60) as sender:
            series = sample_while(sender, px.pid, proxy_port)
        sent = json.loads(out.read_text())
        counts = intake_counts(proxy_port)
    verdict = flatness(series)
    report = {"rss_before_mib": rss_before, "spans": sent, "proxy /metrics": counts, **verdict}
    print("\n" + json.dumps({**report, "series": series}, indent=2))
    unmatched = counts.get("llm_slo_engine_spans_unmatched_total", -1)
    expected = expected_unmatched(sent["spans_acknowledged"])
    rate = sent["achieved_spans_per_s"]
    goals = [
        ("every export answered 200", sent["statuses"].get("200", 0), sent["exports"],
         sent["statuses"].get("200", 0) == sent["exports"]),
        ("every span counted: unmatched == sent (none of ours: dropped on arrival)",
         unmatched, expected, unmatched == expected),
        ("spans/s taken >= 5,000", rate, GOAL_SPANS_PER_S, rate >= GOAL_SPANS_PER_S),
        (f"RSS max, last half, MiB <= max of minutes {0.2 * MINUTES:g}-{0.5 * MINUTES:g} "
         "+ max(5%, 10 MiB)",
         verdict["rss_max_last_half_mib"], verdict["rss_limit_mib"], verdict["flat"]),
    ]  # fmt: skip
    write_section(
        PAGE, TITLE, "unmatched-memory", memory_page(report, series, goals, load_at_start)
    )
    misses = [goal for goal, _measured, _limit, met in goals if not met]
    assert not misses, f"goals missed: {misses}"


def flatness(series: list[dict[str, float]]) -> dict[str, Any]:
    """Warm-up: the first 20% of the run; reference: 20-50% (minutes 2-5 of 10); judged: the
    last half, whose max must stay within max(5%, 10 MiB) of the reference's."""
    total = series[-1]["minute"] if series else 0.0
    reference = [s["rss_mib"] for s in series if 0.2 * total <= s["minute"] <= 0.5 * total]
    last = [s["rss_mib"] for s in series if s["minute"] >= 0.5 * total]
    assert len(reference) >= 2 and len(last) >= 2, f"too few RSS samples: {series}"
    reference_max = max(reference)
    limit = reference_max + max(0.05 * reference_max, 10.0)
    tail = [s for s in series if s["minute"] >= 0.5 * total]
    slope = statistics.linear_regression([s["minute"] for s in tail], [s["rss_mib"] for s in tail])
    return {
        "minutes": total,
        "rss_max_minutes_ref_mib": reference_max,
        "rss_max_last_half_mib": max(last),
        "rss_limit_mib": round(limit, 2),
        "rss_slope_last_half_mib_per_min": round(slope.slope, 3),
        "flat": max(last) <= limit,
    }
