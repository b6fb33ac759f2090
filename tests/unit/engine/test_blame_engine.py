"""Exact blame from the bundled engine to the middleware: every request's `on_blame` comes
right before its `on_finish`, its queue blame sums to the wait its enqueue and schedule marks
say (what the middleware reports as queue), its decode steps split into decode-only cost and
interference, and the bridge puts it on the timeline as the record keeps it and on the delay
counter; with blame off nothing is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from prometheus_client import CollectorRegistry

from engine import Engine, SamplingParams
from engine.blame import QUEUE, RequestBlame
from middleware import ScriptedClock
from middleware.metrics.metric_set import MetricSet
from middleware.request.bridge import EngineBridge
from middleware.request.timeline import RequestTimeline
from slo.records import validate_record
from slo.sli import CATALOG
from slo.spec import SLOSpec
from tests.helpers.checkpoints import checkpoint_fixture, make_engine

checkpoint = checkpoint_fixture(seed=3)
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
SPEC = SLOSpec.default()
CLOSE = {"rel": 1e-9, "abs": 1e-12}


class Recorder:
    """Every event, in order, by request."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[str, int, Any]]] = {}

    def _add(self, request_id: str, event: str, time_ns: int, value: Any = None) -> None:
        self.events.setdefault(request_id, []).append((event, time_ns, value))

    def on_enqueue(self, request_id: str, time_ns: int, prompt_tokens: int, priority: int) -> None:
        self._add(request_id, "enqueue", time_ns)

    def on_schedule(self, request_id: str, time_ns: int) -> None:
        self._add(request_id, "schedule", time_ns)

    def on_token(self, request_id: str, time_ns: int, token_index: int) -> None:
        self._add(request_id, "token", time_ns)

    def on_blame(self, request_id: str, time_ns: int, blame: Any) -> None:
        self._add(request_id, "blame", time_ns, blame)

    def on_finish(self, request_id: str, time_ns: int, reason: str) -> None:
        self._add(request_id, "finish", time_ns)


def serve(engine: Engine, hooks: list[Any], priorities: list[int]) -> list[str]:
    """Requests at `priorities`, submitted together; their ids."""
    for hook in hooks:
        engine.add_hooks(hook)
    ids = [f"r{index}" for index in range(len(priorities))]

    async def all_of_them() -> None:
        streams = [
            engine.submit(f"request {i} " + "lorem " * (3 * i), GREEDY, priority, request_id)
            for i, (priority, request_id) in enumerate(zip(priorities, ids, strict=True))
        ]
        for stream in streams:
            async for _ in stream:
                pass

    asyncio.run(all_of_them())
    return ids


@pytest.fixture
def engine(checkpoint: Path) -> Iterator[Engine]:
    engine = make_engine(checkpoint, max_batch_size=2, warmup=False)
    yield engine
    engine.stop_sync()


def test_each_request_gets_its_blame_before_its_finish_and_the_sums_hold(engine: Engine) -> None:
    recorder = Recorder()
    ids = serve(engine, [recorder], [2, 2, 0, 1, 2, 0])
    for request_id in ids:
        events = recorder.events[request_id]
        names = [name for name, _, _ in events]
        assert names[-2:] == ["blame", "finish"] and names.count("blame") == 1
        (_, blamed_ns, blame), (_, finished_ns, _) = events[-2:]
        assert blamed_ns == finished_ns and isinstance(blame, RequestBlame)
        marks = {name: time for name, time, _ in reversed(events)}  # the first of each
        assert blame.queue_s == pytest.approx((marks["schedule"] - marks["enqueue"]) * 1e-9)
        queue = [s for cause, _, s, _ in blame.by_tier if cause == QUEUE]
        assert sum(queue) == pytest.approx(blame.queue_s, **CLOSE)
        assert blame.decode_only_s + blame.interference_s == pytest.approx(blame.decode_s)
        # Its decode steps began after its first token, the last one ended with it.
        assert 0 < blame.decode_s <= (finished_ns - marks["token"]) * 1e-9
        assert len(blame.top) <= 3
    # With two slots and six requests, some waited behind others, by their tokens.
    assert any(recorder.events[r][-2][2].top for r in ids)


def test_the_bridge_puts_the_blame_on_the_timeline_and_the_counter(engine: Engine) -> None:
    metrics = MetricSet(SPEC, "tiny", CollectorRegistry())
    tiers = {tier.priority: tier.name for tier in SPEC.tiers}
    bridge = EngineBridge(on_blame=metrics.engine.observe_blame, tier_names=tiers)
    timelines = {f"r{i}": RequestTimeline.begin(f"r{i}", ScriptedClock()) for i in range(4)}
    for timeline in timelines.values():
        bridge.register(timeline)
    premium, batch = SPEC.tiers[0], SPEC.tiers[-1]
    serve(engine, [bridge], [batch.priority, batch.priority, batch.priority, premium.priority])
    total = 0.0
    for timeline in timelines.values():
        blame = timeline.delay_blame
        assert blame is not None
        # What the middleware reports as the queue phase: schedule mark - enqueue mark.
        assert timeline.enqueue_ns is not None and timeline.schedule_ns
        queue_s = (timeline.schedule_ns[0] - timeline.enqueue_ns) * 1e-9
        queue = [entry["s"] for entry in blame["by_tier"] if entry["cause"] == QUEUE]
        assert sum(queue) == pytest.approx(queue_s, **CLOSE)
        assert {entry["tier"] for entry in blame["by_tier"]} <= {*tiers.values(), "none"}
        record = {"request_id": "r", "tier": "t", "timestamp": 1.0, "e2e_s": 1.0}
        assert validate_record({**record, "delay_blame": blame})["delay_blame"] == blame
        total += sum(entry["s"] for entry in blame["by_tier"])
    counted = sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == CATALOG["delay_caused"].metric.removesuffix("_total")
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    assert counted == pytest.approx(total)


def test_blame_off_sends_none(checkpoint: Path) -> None:
    engine = make_engine(checkpoint, blame=False, warmup=False)
    try:
        recorder = Recorder()
        ids = serve(engine, [recorder], [0, 1])
        assert all("blame" not in [n for n, _, _ in recorder.events[r]] for r in ids)
        assert all(recorder.events[r][-1][0] == "finish" for r in ids)
    finally:
        engine.stop_sync()
