"""A known traffic for the dashboard's value checks, through the middleware's own reporting.

The default spec's three tiers on the chat and completions routes. Every 30 seconds a batch of
settled requests with known breakdowns (`planned`: ok ones spread over the buckets, and each
kind of failure every few batches) is reported by the middleware's Reporter, as a finished
request is: into its metrics (the gen_ai.* ones included), its live windows and a SQLite
record store. Three engine steps per batch go to the engine series, two GPUs are read through
the stand-in NVML at every scrape (GPU 1's read fails at the scrape before the last), and the
engine came up in 12.5 s before the first scrape. Then `/metrics` is scraped through the
middleware, in OpenMetrics, as a Prometheus would scrape it, and the scrape is stamped with the
time it stands for: `START` (every series at 0, as born), then one every `SCRAPE_S` up to
`QUERY_AT`.

Every group a panel splits by (tier, outcome, gen_ai operation and requested model, GPU) has
traffic in the last four scrapes, so a NaN in a panel can only come from a query that reads nothing
where the records hold data.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.gpu import GpuTelemetry
from engine.hooks import StepStats
from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from middleware.request.breakdown import Breakdown
from middleware.request.measured import MeasuredRequest
from middleware.request.timeline import RequestTimeline
from middleware.types import Message
from slo.records import RequestRecord
from slo.sli import outcome_for_status
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.measured import settled_request
from tests.helpers.nvml_standin import NVML_ERROR_GPU_IS_LOST, StandinGpu, StandinNvml

SCRAPE_S = 30  # a Prometheus' scrape and evaluation interval
HOUR_S = 1_699_999_200  # an hour boundary: the hourly tiles of the long windows end here
START = HOUR_S - 300  # the first scrape, every series at 0: one 5-minute tile before the hour
QUERY_AT = HOUR_S + 60  # where every panel is read
MODEL = "known-model"
ROUTES = ("/v1/chat/completions", "/v1/completions")
INSTANCE = "replica-a:8000"
COLD_START_S = 12.5
GIB = 2**30
# Failures: (tier, status, every n-th batch); the outcome follows from the status.
FAILURES = (
    ("premium", 500, 3),
    ("standard", 400, 1),
    ("standard", 504, 4),
    ("standard", 499, 5),
    ("batch", 503, 2),
    ("batch", 429, 3),
)
OK_PER_BATCH = {"premium": 4, "standard": 3, "batch": 2}
SLOWER = {"premium": 1.0, "standard": 1.6, "batch": 3.0}
# The gen_ai series split by requested model: these ok requests name none.
UNNAMED = (("standard", "/v1/chat/completions"), ("batch", "/v1/completions"))
# The scrape (by batch) at which NVML fails to read GPU 1, once: it is left out of that scrape.
GPU_LOST_AT = (QUERY_AT - SCRAPE_S - START) // SCRAPE_S


@dataclass(frozen=True)
class Planned:
    """One request of a batch, as the middleware settles it."""

    tier: str
    route: str
    status: int
    breakdown: Breakdown
    input_tokens: int
    named: bool = True  # the request body names the model

    @property
    def outcome(self) -> str:
        return outcome_for_status(self.status)


@dataclass
class Known:
    """What went in: the records the store kept, the engine's steps with their times, the GPUs
    as last read, and the scrapes (time, OpenMetrics text)."""

    spec: SLOSpec
    records: list[RequestRecord]
    steps: list[tuple[float, StepStats]]
    gpus: list[StandinGpu]
    gpu_errors: list[float] = field(default_factory=list)  # times of NVML's failed calls
    scrapes: list[tuple[float, str]] = field(default_factory=list)
    unnamed: set[str] = field(default_factory=set)  # ids of the requests that named no model

    def records_in(self, start: float, end: float) -> list[RequestRecord]:
        """The records of requests that started in (start, end]."""
        return [r for r in self.records if start < r.timestamp <= end]

    def steps_in(self, start: float, end: float) -> list[StepStats]:
        return [stats for at, stats in self.steps if start < at <= end]


@dataclass(slots=True, eq=False)
class KnownTimeline(RequestTimeline):
    """A request's timeline whose breakdown is known: the reporter reads it as it reads one it
    measured."""

    known: Breakdown | None = None

    def breakdown(self) -> Breakdown:
        assert self.known is not None
        return self.known


def _ok_breakdown(rng: random.Random, tier: str) -> tuple[Breakdown, int]:
    """An ok request's additive breakdown and its input tokens."""
    slower = SLOWER[tier]
    output_tokens = rng.randint(2, 40)
    gaps = tuple(rng.uniform(0.005, 0.09) * slower for _ in range(output_tokens - 1))
    network, other = rng.uniform(0.0005, 0.003), rng.uniform(0.0, 0.002)
    queue, prefill = rng.uniform(0.0, 0.06) * slower, rng.uniform(0.005, 0.2) * slower
    ttft = network + queue + prefill + other
    detokenize = 0.02 * sum(gaps)
    e2e = ttft + sum(gaps)
    breakdown = Breakdown(
        e2e_s=e2e,
        ttft_s=ttft,
        tpot_s=(e2e - ttft) / (output_tokens - 1),
        itl_s=gaps,
        network_s=network,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=sum(gaps) - detokenize,
        detokenize_s=detokenize,
        other_s=other,
        output_tokens=output_tokens,
        tokens_source="engine",
    )
    return breakdown, rng.randint(5, 900)


def _failed_breakdown(rng: random.Random) -> Breakdown:
    e2e = rng.uniform(0.002, 0.05)
    return Breakdown(e2e, None, None, (), e2e, None, None, 0.0, 0.0, 0.0, 0)


def planned(batch: int) -> list[Planned]:
    """The requests of batch `batch` (1, 2, ...): the same kinds in every batch, other values."""
    rng = random.Random(43_000 + batch)
    requests = []
    for tier, count in OK_PER_BATCH.items():
        for index in range(count):
            breakdown, input_tokens = _ok_breakdown(rng, tier)
            route = ROUTES[(batch + index) % len(ROUTES)]
            requests.append(Planned(tier, route, 200, breakdown, input_tokens))
    for tier, route in UNNAMED:
        breakdown, input_tokens = _ok_breakdown(rng, tier)
        requests.append(Planned(tier, route, 200, breakdown, input_tokens, named=False))
    for index, (tier, status, every) in enumerate(FAILURES):
        if batch % every == 0:
            route = ROUTES[index % len(ROUTES)]
            requests.append(
                Planned(tier, route, status, _failed_breakdown(rng), rng.randint(5, 50))
            )
    return requests


def engine_steps(batch: int) -> list[StepStats]:
    """Three scheduler steps per batch; priorities 0, 1, 2 are premium, standard, batch."""
    steps = []
    for j in range(3):
        n = batch + j
        steps.append(
            StepStats(
                step=3 * batch + j,
                time_ns=0,
                step_time_s=0.02,
                batch_size=4 + n % 5,
                prefill_tokens=64 * (1 + n % 2),
                decode_tokens=8,
                num_waiting=0,
                num_running=3 + n % 4,
                num_preempted=0,
                kv_blocks_total=1000,
                kv_blocks_free=1000 - 37 * (1 + n % 7),
                waiting_by_priority={0: j, 1: 1 + batch % 3, 2: 2 * j + batch % 2},
                prefix_cache_queried_tokens=120 + 10 * j,
                prefix_cache_hit_tokens=30 + 7 * (n % 4),
                spec_draft_tokens=16,
                spec_accepted_tokens=5 + n % 9,
                prefill_chunks=1 + n % 3,
                preempted_by_priority={2: 1, 1: n % 2} if n % 4 == 0 else {},
                queue_waits=((0, 0.002 * (j + 1)), (1, 0.011 * (1 + n % 5)), (2, 0.3 * (j + 1))),
                shed=((2, "queue_full"),) if j == 0 and batch % 2 == 0 else (),
            )
        )
    return steps


def _gpus(batch: int) -> list[StandinGpu]:
    return [
        StandinGpu(utilization_percent=40 + batch % 50, memory_used_bytes=(20 + batch) * GIB),
        StandinGpu(utilization_percent=90 - batch % 30, memory_used_bytes=(60 - batch) * GIB),
    ]


def _request(item: Planned, at: float, number: int) -> MeasuredRequest:
    clock = ScriptedClock(wall_s=at)
    timeline = KnownTimeline(
        request_id=f"known-{number}", clock=clock, wall_start_s=at, known=item.breakdown
    )
    body = {"model": MODEL} if item.named else {}
    return settled_request(
        item.tier,
        item.route,
        item.outcome,
        status=item.status,
        input_tokens=item.input_tokens,
        timeline=timeline,
        body=json.dumps({**body, "messages": []}).encode(),
    )


async def _scrape(middleware: LatencyMiddleware) -> str:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    accept = (b"accept", b"application/openmetrics-text; version=1.0.0")
    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": [accept]}
    await middleware(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


async def _unused_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the known traffic is reported, not served")


def batch_times() -> Iterator[tuple[int, float]]:
    """(batch, scrape time after it): batch k's requests start half a scrape before."""
    for batch in range(1, (QUERY_AT - START) // SCRAPE_S + 1):
        yield batch, float(START + batch * SCRAPE_S)


def _run(middleware: LatencyMiddleware, nvml: StandinNvml, known: Known) -> None:
    middleware.observe_cold_start(COLD_START_S)
    known.scrapes.append((float(START), asyncio.run(_scrape(middleware))))
    number = 0
    for batch, scrape_at in batch_times():
        for item in planned(batch):
            number += 1
            request = _request(item, scrape_at - SCRAPE_S / 2, number)
            if not item.named:
                known.unnamed.add(request.timeline.request_id)
            middleware.reporter.report(request, None)
        for j, stats in enumerate(engine_steps(batch)):
            middleware.metrics.observe_engine_step(stats)
            known.steps.append((scrape_at - SCRAPE_S + 7 * (j + 1), stats))
        nvml.gpus[:] = _gpus(batch)
        if batch == GPU_LOST_AT:
            nvml.fail("nvmlDeviceGetMemoryInfo", NVML_ERROR_GPU_IS_LOST, index=1, times=1)
            known.gpu_errors.append(scrape_at)
        known.scrapes.append((scrape_at, asyncio.run(_scrape(middleware))))
    known.gpus = list(nvml.gpus)


def known_traffic(tmp_path: Path) -> Known:
    """Report the whole traffic and read back the records the store kept."""
    spec = SLOSpec.default()
    nvml = StandinNvml(gpus=_gpus(0))
    store_url = f"sqlite:///{tmp_path / 'known.db'}"
    config = MiddlewareConfig.of(
        llm_routes=ROUTES, models=(MODEL,), genai_metrics=True, gpu_stats=GpuTelemetry(nvml).read
    )
    middleware = LatencyMiddleware(
        _unused_app, spec=spec, store=store_url, model=MODEL, config=config
    )
    known = Known(spec, [], [], [])
    try:
        _run(middleware, nvml, known)
    finally:
        middleware.close()
    with RecordStore(store_url) as store:
        known.records = store.query()
    return known
