"""The docs/benchmarks/engine-span-intake.md sections of test_engine_span_intake.py: its
figures as tables, each goal with its measured value, limit and ratio, under the stamp of the
run (commit, date, machine, load)."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.bench_record import stamp, table
from tests.benchmarks.span_intake import (
    GOAL_SPANS_PER_S,
    MINUTES,
    RSS_EVERY_S,
    SPANS_PER_EXPORT,
)
from tests.helpers.proxy_load import ROUNDS


def figure(value: float) -> str:
    """A count as 2,990,320; anything else as Python's shortest form."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def ratio(measured: float, limit: float) -> float:
    return round(measured / limit, 3) if limit else float("inf")


def intake_page(report: dict[str, Any], goals: list[Any], load_at_start: str) -> str:
    streams = []
    for phase in ("no spans", "5,000 spans/s"):
        figures = report[phase]
        for name in ("direct", "slo proxy", "nginx"):
            proxied = name != "direct"
            streams.append(
                [
                    phase,
                    name,
                    figures["ttft_p50_ms"][name],
                    figures["added_ttft_p50_ms"][name] if proxied else "",
                    figures["added_ttft_p99_ms"][name] if proxied else "",
                    figures["cpu_us_per_event"][name] if proxied else "",
                    figures["cpu_us_per_event"]["ratio slo/nginx (goal <= 3)"] if proxied else "",
                    figures["events_per_s"][name],
                    figures["throughput_vs_direct"][name] if proxied else "",
                ]
            )
    spans = []
    for phase in ("spans paced", "spans back to back"):
        sent = report[phase]
        spans.append(
            [
                "5,000/s, 64 streams running" if phase == "spans paced" else "back to back, alone",
                sent["exports"],
                ", ".join(f"{k}: {v}" for k, v in sent["statuses"].items()),
                sent["achieved_spans_per_s"],
                ratio(sent["achieved_spans_per_s"], GOAL_SPANS_PER_S),
                f"{sent['export_ms_p50']} / {sent['export_ms_p99']} / {sent['export_ms_max']}",
                sent["max_lag_ms"] if phase == "spans paced" else "",
            ]
        )
    flat = report["spans back to back"]
    cpu_share = flat["proxy_cpu_us_per_span"] * GOAL_SPANS_PER_S / 1e6
    return "\n\n".join(
        [
            "## While proxying 64 streams",
            stamp(load_at_start),
            '`python -m pytest tests/benchmarks/test_engine_span_intake.py -o addopts="" -s '
            "-p no:cacheprovider -k while_proxying`: `slo proxy` and nginx pinned to one core; "
            "upstream, clients and span exporter on the other. Medians of "
            f"{ROUNDS} interleaved rounds of 64 steady streams (35 SSE events each, 10 ms apart). "
            "Other processes took "
            f"{report['no spans']['others_on_proxy_core']:.0%} (no spans) and "
            f"{report['5,000 spans/s']['others_on_proxy_core']:.0%} (spans) of the proxies' core "
            "meanwhile.",
            table(
                [
                    "spans",
                    "variant",
                    "TTFT p50 ms",
                    "added p50 ms",
                    "added p99 ms",
                    "CPU us/event",
                    "CPU slo/nginx",
                    "events/s",
                    "vs direct",
                ],
                streams,
            ),
            f"Engine spans ({SPANS_PER_EXPORT} per OTLP/HTTP protobuf export, unknown traces):",
            table(
                [
                    "exporter",
                    "exports",
                    "answers",
                    "spans/s taken",
                    "ratio to 5,000",
                    "export ms p50 / p99 / max",
                    "max lag ms",
                ],
                spans,
            ),
            f"Proxy CPU per span (back to back): {flat['proxy_cpu_us_per_span']} us, so 5,000 "
            f"spans/s take {cpu_share:.1%} of its core. /metrics: "
            + ", ".join(f"`{k}` {figure(v)}" for k, v in report["proxy /metrics"].items()),
            goals_table(goals),
        ]
    )


def goals_table(goals: list[tuple[str, float, float, bool]]) -> str:
    rows = [
        [goal, figure(measured), figure(limit), ratio(measured, limit), "yes" if met else "**no**"]
        for goal, measured, limit, met in goals
    ]
    return table(["goal", "measured", "limit", "ratio", "met"], rows)


def memory_page(
    report: dict[str, Any], series: list[dict[str, float]], goals: list[Any], load_at_start: str
) -> str:
    sent = report["spans"]
    rows = [[s["minute"], s["rss_mib"], s["cpu_share"], figure(s["unmatched"])] for s in series]
    return "\n\n".join(
        [
            "## Memory for unmatched spans",
            stamp(load_at_start),
            f"`LLM_SLO_BENCH_SPAN_MINUTES={MINUTES:g} python -m pytest "
            'tests/benchmarks/test_engine_span_intake.py -o addopts="" -s -p no:cacheprovider '
            "-k memory`: `slo proxy` alone on one core, 5,000 vLLM spans/s for traces it never "
            f"saw, {SPANS_PER_EXPORT} per export, for {MINUTES:g} minutes; RSS "
            f"(/proc/PID/status VmRSS) every {RSS_EVERY_S:g} s. RSS before the spans: "
            f"{report['rss_before_mib']} MiB. Exports: {sent['exports']} "
            f"({', '.join(f'{k}: {v}' for k, v in sent['statuses'].items())}), "
            f"{sent['achieved_spans_per_s']} spans/s, export ms p50 / p99 / max "
            f"{sent['export_ms_p50']} / {sent['export_ms_p99']} / {sent['export_ms_max']}. "
            "Slope of RSS over the last half: "
            f"{report['rss_slope_last_half_mib_per_min']} MiB/min.",
            table(["minute", "RSS MiB", "proxy CPU (of its core)", "unmatched spans"], rows),
            goals_table(goals),
        ]
    )
