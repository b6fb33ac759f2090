"""One step of `slo bench --find-max-rate` / `--find-max-concurrency`: a load, run and judged.

A step sends warm-up requests then the measured ones, at one arrival rate (open loop) or one
concurrency (closed loop). Warm-up requests are sent and waited for but not judged: the
server's queues and batches reach the step's load before anything counts. In open loop the
warm-up is by send time (requests scheduled before the first measured one), in closed loop
by finish order (the first `warmup` to finish). The step ends early, failed, as soon as it
can no longer pass (`slo.capacity.judge.ClearMiss`).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slo.capacity.arrivals import ArrivalKind, Lateness, lateness_of
from slo.capacity.backlog import Backlog, backlog_of, judge_backlogs
from slo.capacity.judge import ClearMiss, TierStep, judge_step
from slo.check.summary import columns_of, good_requests
from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import PlannedRequest, Profile, plan_requests
from slo.spec import SLOSpec

if TYPE_CHECKING:
    from slo.cli.bench.runner import RunResult


@dataclass(frozen=True)
class StepShape:
    """What every step of one search shares."""

    profile: Profile
    mix: tuple[tuple[str, float], ...]
    warmup: int
    measured: int
    context: int
    seed: int
    chars_per_token: float
    arrival: ArrivalKind = "poisson"
    burstiness: float = 1.0
    request_timeout_s: float = 300.0
    min_window_s: float = 0.0  # open loop: the measured window lasts at least this long
    warmup_share: float = 0.2

    def sizes(self, rate: float | None) -> tuple[int, int]:
        """(warm-up, measured) requests of a step at `rate` (None: closed loop): the tail
        rule's count, or more when the step would otherwise last under `min_window_s`."""
        if rate is None or rate * self.min_window_s <= self.measured:
            return self.warmup, self.measured
        measured = math.ceil(rate * self.min_window_s)
        return max(self.warmup, math.ceil(self.warmup_share * measured)), measured


@dataclass
class StepReport:
    index: int
    load: float  # requests/s or concurrency
    mode: str  # "rate" or "concurrency"
    verdict: str  # "pass", "fail" or "client_behind"
    tiers: dict[str, TierStep]
    measured_records: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    goodput_rps: float | None = None
    throughput_rps: float | None = None
    output_tokens_per_s: float | None = None
    mean_output_tokens: float | None = None
    lateness: Lateness | None = None
    # Open loop, per tier: did the server keep up with the arrivals (slo.capacity.backlog)
    backlog: dict[str, Backlog] = field(default_factory=dict)
    stopped_early: str | None = None
    records_file: str | None = None

    @property
    def passed(self) -> bool:
        """A step whose client fell behind counts as failed: its load was not the asked one,
        so it cannot be a pass, and the search narrows below it (capacity.json then warns
        that the bracket's top is the client's, not known to be the server's)."""
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.index,
            self.mode: self.load,
            "verdict": self.verdict,
            "measured_requests": len(self.measured_records),
            "elapsed_s": round(self.elapsed_s, 3),
            "goodput_rps": self.goodput_rps,
            "throughput_rps": self.throughput_rps,
            "output_tokens_per_s": self.output_tokens_per_s,
            "mean_output_tokens": self.mean_output_tokens,
            "stopped_early": self.stopped_early,
            "lateness": self.lateness.to_dict() if self.lateness else None,
            "backlog": {name: backlog.to_dict() for name, backlog in self.backlog.items()},
            "records": self.records_file,
            "tiers": {name: tier.to_dict() for name, tier in self.tiers.items()},
        }


def plan_step(shape: StepShape, index: int, rate: float | None) -> list[PlannedRequest]:
    return plan_requests(
        shape.profile,
        sum(shape.sizes(rate)),
        seed=shape.seed + index,
        max_model_len=shape.context,
        rate=rate,
        tier_mix=shape.mix,
        chars_per_token=shape.chars_per_token,
        arrival=shape.arrival,
        burstiness=shape.burstiness,
    )


def run_step(
    spec: SLOSpec,
    shape: StepShape,
    base_url: str,
    settings: RequestSettings,
    index: int,
    load: float,
    mode: str,
) -> StepReport:
    """Run and judge one step at `load` (req/s in mode "rate", in-flight requests else)."""
    rate = load if mode == "rate" else None
    plan = plan_step(shape, index, rate)
    warmup, _ = shape.sizes(rate)
    measured_plan = plan[warmup:]
    miss = ClearMiss(spec, Counter(p.tier for p in measured_plan))
    finished = 0
    measured: list[dict[str, Any]] = []
    sends: dict[str, list[float]] = {}
    finishes: dict[str, list[float]] = {}

    def stop_when(record: dict[str, Any], planned: PlannedRequest) -> bool:
        # Open loop: warm-up is what was planned first; closed loop: what finished first.
        nonlocal finished
        finished += 1
        sends.setdefault(planned.tier, []).append(record["timestamp"])
        finishes.setdefault(planned.tier, []).append(_finished_at(record))
        position = planned.index if rate is not None else finished - 1
        if position < warmup:
            return False
        measured.append(record)
        return miss(record)

    result = _run(base_url, plan, settings, shape, rate, load, stop_when)
    report = _judge(spec, index, load, mode, measured, miss)
    report.elapsed_s = result.elapsed_s
    if rate is not None:
        # Against the rate of the schedule as drawn (a Poisson draw of 100 gaps is ~10% off
        # the asked rate), over the requests that were sent (a step may stop early).
        sent = len(result.sent_at)
        drawn_span = plan[sent - 1].offset_s if sent > 1 else 0.0
        scheduled = (sent - 1) / drawn_span if drawn_span > 0 else rate
        report.lateness = lateness_of(result.late_s, result.sent_at, scheduled)
        if measured and miss.missed is None:
            _judge_backlog(report, sends, finishes)
        if report.lateness.behind:
            report.verdict = _server_verdict(spec, report)
    return report


def _run(
    base_url: str,
    plan: list[PlannedRequest],
    settings: RequestSettings,
    shape: StepShape,
    rate: float | None,
    load: float,
    stop_when: Callable[[dict[str, Any], PlannedRequest], bool],
) -> RunResult:
    """Send the step's plan: open loop at `rate`, else `load` requests in flight."""
    from slo.cli.bench.runner import run_plan

    # Time enough for the plan at the asked load and the last requests to finish.
    planned_s = plan[-1].offset_s if rate else len(plan) * 60.0 / max(load, 1)
    limit_s = planned_s * 2 + shape.request_timeout_s
    return asyncio.run(
        run_plan(
            base_url,
            plan,
            settings,
            concurrency=None if rate else int(load),
            duration_limit_s=limit_s,
            out=None,
            progress=False,
            stop_when=stop_when,
        )
    )


def _judge_backlog(
    report: StepReport, sends: dict[str, list[float]], finishes: dict[str, list[float]]
) -> None:
    """Each tier's backlog over the measured window (its first to last send); a tier whose
    server fell behind fails the step (`slo.capacity.backlog`)."""
    window = (
        min(r["timestamp"] for r in report.measured_records),
        max(r["timestamp"] for r in report.measured_records),
    )
    for tier, sent in sends.items():
        backlog = backlog_of(sent, finishes[tier], window)
        if backlog is not None:
            report.backlog[tier] = backlog
    judge_backlogs(report.tiers, report.backlog)
    if any(tier.verdict == "fail" for tier in report.tiers.values()):
        report.verdict = "fail"


def _server_verdict(spec: SLOSpec, report: StepReport) -> str:
    """The verdict of a step whose client fell behind. The client's own timings are then
    suspect (its stalls are in them) and the load was not the asked one. Where the server
    timed every request itself (the middleware's Server-Timing), the step is judged on those
    alone: a miss there is the server's, at the load the client did send ("fail"); otherwise,
    or when it passes, the step says nothing ("client_behind")."""
    server_only = [
        {key: value for key, value in record.items() if not key.startswith("client_")}
        for record in report.measured_records
    ]
    if not server_only or not all("ttft_s" in record for record in server_only):
        return "client_behind"
    tiers = judge_step(spec, server_only)
    failed = any(tier.verdict == "fail" for tier in tiers.values())
    return "fail" if failed else "client_behind"


def _judge(
    spec: SLOSpec,
    index: int,
    load: float,
    mode: str,
    measured: list[dict[str, Any]],
    miss: ClearMiss,
) -> StepReport:
    tiers = judge_step(spec, measured) if measured else {}
    if miss.missed is not None:  # the objective that can no longer be met fails the tier
        tier_name, objective_name = miss.missed
        tier = tiers.get(tier_name)
        if tier is not None:
            for objective in tier.objectives:
                if objective["objective"] == objective_name:
                    objective["verdict"] = "violated"
            tiers[tier_name] = TierStep(
                tier.tier, tier.requests, "fail", tier.objectives, tier.percentiles_s
            )
        # The other tiers saw only the start of the step: it judges none of them.
        for name, other in tiers.items():
            if name != tier_name:
                tiers[name] = TierStep(
                    other.tier, other.requests, "no_data", other.objectives, other.percentiles_s
                )
    passed = (
        bool(tiers) and miss.missed is None and all(t.verdict == "pass" for t in tiers.values())
    )
    report = StepReport(index, load, mode, "pass" if passed else "fail", tiers, measured)
    report.stopped_early = miss.reason
    _rates(spec, report)
    return report


def _rates(spec: SLOSpec, report: StepReport) -> None:
    """Goodput, throughput and output tokens per second over the measured window: from the
    first measured send to the last measured finish."""
    records = report.measured_records
    if not records:
        return
    starts = [r["timestamp"] for r in records]
    ends = [_finished_at(r) for r in records]
    span = max(ends) - min(starts)
    if span <= 0:
        return
    good = int(good_requests(spec, columns_of(records)).sum())
    ok = [r for r in records if r.get("outcome") == "ok"]
    tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    report.goodput_rps = round(good / span, 4)
    report.throughput_rps = round(len(ok) / span, 4)
    report.output_tokens_per_s = round(tokens / span, 3)
    report.mean_output_tokens = round(tokens / len(ok), 3) if ok else None


def _finished_at(record: dict[str, Any]) -> float:
    """When the request finished, on the client's clock (its send time plus its e2e)."""
    return float(record["timestamp"] + record.get("client_e2e_s", record["e2e_s"]))
