"""`slo bench --find-max-rate` / `--find-max-concurrency`: the highest load every tier's SLO
holds, searched step by step (`slo.capacity.search`), each step judged per tier
(`slo.capacity.judge`), written to capacity.json with one JSONL of records per step.

The first estimate, unless `--start` gives one: a saturation probe, as vLLM's sweep runs one
load at an infinite rate: a closed loop at `--probe-concurrency` whose completions per
second (after the first wave) bound what the server can finish; the search starts at 0.8 of
it, since an SLO gives way before throughput does.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from slo.capacity import result as capacity_file
from slo.capacity.judge import measured_requests
from slo.capacity.search import SearchOutcome, SearchSettings, find_max
from slo.cli.bench.step import StepReport, StepShape, run_step
from slo.errors import UsageError
from slo.spec import SLOSpec

START_SHARE = 0.8


@dataclass
class CapacityOptions:
    mode: str  # "rate" or "concurrency"
    resolution: float = SearchSettings.resolution
    max_steps: int = SearchSettings.max_steps
    confirm: int = SearchSettings.confirmations
    tail_events: int = 10
    min_requests: int = 20
    warmup_share: float = 0.2
    start: float | None = None
    probe_concurrency: int = 32
    out_dir: Path | None = None
    cooldown_s: float = 2.0

    def check(self) -> None:
        problems = [
            (not 0 < self.resolution < 1, f"--resolution must be in (0, 1), got {self.resolution}"),
            (self.max_steps < 2, f"--max-steps must be >= 2, got {self.max_steps}"),
            (self.confirm < 0, f"--confirm must be >= 0, got {self.confirm}"),
            (self.tail_events < 1, f"--tail-events must be >= 1, got {self.tail_events}"),
            (
                not 0 <= self.warmup_share < 1,
                f"--warmup must be in [0, 1), got {self.warmup_share}",
            ),
            (
                self.start is not None and not self.start > 0,
                f"--start must be > 0, got {self.start}",
            ),
            (not self.cooldown_s >= 0, f"--cooldown must be >= 0, got {self.cooldown_s}"),
            (
                self.probe_concurrency < 1,
                f"--probe-concurrency must be >= 1, got {self.probe_concurrency}",
            ),
        ]
        for failed, message in problems:
            if failed:
                raise UsageError(message)


def search(
    spec: SLOSpec, shape: StepShape, options: CapacityOptions, base_url: str, settings: Any
) -> dict[str, Any]:
    """Run the search against `base_url`; return the capacity document (also written to
    `options.out_dir` when given)."""
    steps: list[StepReport] = []
    start, probe_rate = options.start, None
    if start is None and options.mode == "concurrency":
        start = 1.0
    elif start is None:
        probe_rate = _saturation(shape, options, base_url, settings)
        start = START_SHARE * probe_rate

    def run(load: float) -> StepReport:
        if steps and steps[-1].verdict != "pass":
            time.sleep(options.cooldown_s)  # what the last step left in the server drains
        again = any(step.load == load for step in steps)
        report = run_step(spec, shape, base_url, settings, len(steps) + 1, load, options.mode)
        steps.append(report)
        _keep(report, options.out_dir)
        print(_step_line(report, again), flush=True)
        return report

    def probe(load: float) -> bool:
        report = run(load)
        if report.verdict == "client_behind":  # a stall of a busy machine: once more
            report = run(load)
        return report.passed

    outcome = find_max(
        probe,
        SearchSettings(
            start=start,
            resolution=options.resolution,
            max_steps=options.max_steps,
            integer=options.mode == "concurrency",
            confirmations=options.confirm,
        ),
    )
    document = _document(outcome, steps, probe_rate, shape, options, base_url, settings)
    if options.out_dir is not None:
        capacity_file.write(options.out_dir / "capacity.json", document)
    return document


def _document(
    outcome: SearchOutcome,
    steps: list[StepReport],
    probe_rate: float | None,
    shape: StepShape,
    options: CapacityOptions,
    base_url: str,
    settings: Any,
) -> dict[str, Any]:
    """The capacity document (`slo.capacity.result`): the answer, how it was found, each step."""
    return {
        "version": capacity_file.VERSION,
        "mode": options.mode,
        "unit": capacity_file.MODES[options.mode],
        capacity_file.load_key(options.mode): outcome.best,
        "lowest_failing": outcome.lowest_failing,
        "resolution": options.resolution,
        "confirmations": options.confirm,
        "stopped": outcome.stopped,
        "warnings": [
            f"step {s.index} at {s.load:g}: the client fell behind its schedule; that step "
            "says nothing of the server, so the limit lies between max_rate and the lowest "
            "load that failed with the client on time"
            for s in steps
            if s.verdict == "client_behind"
        ],
        "saturation_probe": None
        if probe_rate is None
        else {"concurrency": options.probe_concurrency, "finished_rps": round(probe_rate, 4)},
        "per_tier": capacity_file.per_tier([s.to_dict() for s in steps], options.mode),
        "window": _window(shape, options),
        "workload": {
            "profile": shape.profile.name,
            "tier_mix": dict(shape.mix),
            "arrival": shape.arrival,
            "burstiness": shape.burstiness,
            "seed": shape.seed,
            "model": settings.model,
            "target": base_url,
        },
        "engine": engine_settings(base_url, settings.model),
        "steps": [s.to_dict() for s in steps],
    }


def _window(shape: StepShape, options: CapacityOptions) -> dict[str, Any]:
    return {
        "warmup_requests": shape.warmup,
        "measured_requests": shape.measured,
        "tail_events": options.tail_events,
        "min_window_s": shape.min_window_s,
        "rule": "each tier gets tail_events requests beyond its strictest target q: "
        "tail_events / (1 - q) of its requests, over its share of the mix; at a rate R, at "
        "least R x min_window_s (queues need time to build); warm-up = "
        f"{options.warmup_share:g} of that, sent first and not judged",
    }


def step_shape_sizes(
    spec: SLOSpec, mix: tuple[tuple[str, float], ...], options: CapacityOptions
) -> tuple[int, int]:
    """(warm-up, measured) requests per step."""
    measured = measured_requests(spec, mix, options.tail_events, options.min_requests)
    return math.ceil(options.warmup_share * measured), measured


def _saturation(shape: StepShape, options: CapacityOptions, base_url: str, settings: Any) -> float:
    """Completions per second in a closed loop at the probe's concurrency, after its first
    wave (the requests that found an idle server)."""
    import asyncio

    from slo.cli.bench.runner import run_plan
    from slo.cli.bench.step import plan_step

    width = options.probe_concurrency
    count = max(4 * width, 2 * options.min_requests)
    probe_shape = StepShape(**{**shape.__dict__, "warmup": 0, "measured": count})
    plan = plan_step(probe_shape, 0, None)
    result = asyncio.run(
        run_plan(
            base_url,
            plan,
            settings,
            concurrency=width,
            out=None,
            progress=False,
            duration_limit_s=shape.request_timeout_s * 4,
        )
    )
    ends = sorted(
        r["timestamp"] + r.get("client_e2e_s", r["e2e_s"])
        for r in result.records
        if r.get("outcome") == "ok"
    )
    if len(ends) <= width or ends[-1] <= ends[width - 1]:
        raise UsageError(
            f"{base_url}: the saturation probe finished {len(ends)} of {count} requests ok; "
            "check the server, or give a first load with --start"
        )
    rate = (len(ends) - width) / (ends[-1] - ends[width - 1])
    print(
        f"slo bench: saturation probe (concurrency {width}): {rate:.3g} req/s finished; "
        f"the search starts at {START_SHARE:g}x that",
        flush=True,
    )
    return rate


def engine_settings(base_url: str, model: str) -> dict[str, Any]:
    """What the server says of its scheduling (ours lists it in /v1/models), for `slo plan`
    to compare runs by; empty for servers that do not say."""
    try:
        listed = httpx.get(base_url + "/v1/models", timeout=10).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}
    for entry in listed:
        if isinstance(entry, dict) and entry.get("id") == model:
            scheduling = entry.get("scheduling")
            return dict(scheduling) if isinstance(scheduling, dict) else {}
    return {}


def _keep(report: StepReport, out_dir: Path | None) -> None:
    if out_dir is None:
        return
    name = f"step-{report.index:02d}.jsonl"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / name).open("w", encoding="utf-8") as handle:
            for record in report.measured_records:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    except OSError as error:
        raise UsageError(f"--out {out_dir}: cannot write {name} ({error.strerror})") from None
    report.records_file = name


def _step_line(report: StepReport, again: bool = False) -> str:
    unit = "req/s" if report.mode == "rate" else "in flight"
    if again:
        unit += " (again, a fresh draw)"
    worst = [
        f"{name}: {tier.binding['objective']}"
        for name, tier in report.tiers.items()
        if tier.binding is not None
    ]
    text = (
        f"step {report.index}: {report.load:g} {unit}: {report.verdict.upper()}, "
        f"{len(report.measured_records)} measured in {report.elapsed_s:.1f} s, goodput "
        f"{report.goodput_rps if report.goodput_rps is not None else '-'} req/s"
    )
    if worst:
        text += " (failed " + "; ".join(worst) + ")"
    if report.stopped_early:
        text += ", stopped early"
    for name, backlog in report.backlog.items():
        if not backlog.kept_up:
            text += f"\n  {name}: {backlog.describe()}"
    if report.lateness is not None and report.lateness.behind:
        text += "\n  " + report.lateness.describe()
    return text


def summary_lines(document: dict[str, Any]) -> list[str]:
    mode = document["mode"]
    key = capacity_file.load_key(mode)
    unit = document["unit"]
    best = document[key]
    lines = [
        f"{key}: {best:g} {unit}" if best is not None else f"{key}: none passed",
    ]
    if document.get("stopped"):
        lines.append(f"the search stopped early: {document['stopped']}")
    lines += [f"warning: {warning}" for warning in document.get("warnings", [])]
    for name, tier in document["per_tier"].items():
        load = tier.get(key)
        shown = f"{load:g}" if load is not None else "none"
        binding = tier.get("binding_objective")
        why = f"bound by {binding}" if binding else tier.get("note", "-")
        lines.append(f"  {name}: up to {shown} {unit}; {why}")
    return lines
