"""The fast observe paths (one value, many values, batched requests) give what
prometheus_client's own `observe` gives."""

from __future__ import annotations

import bisect
import os
import random
import tempfile
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from middleware.metrics.histograms import bucket_counts
from middleware.metrics.metric_set import REQUEST_HISTOGRAMS, MetricSet
from middleware.request.timeline import Breakdown
from slo.spec import SLOSpec
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)
from tests.helpers.measured import settled_request

BOUNDS = (0.001, 0.01, 0.1, 0.25, 1.0, 10.0)


@given(st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=80))
def test_bucket_counts_match_one_bisect_per_value(values: list[float]) -> None:
    expected: dict[int, int] = {}
    for value in values:
        index = bisect.bisect_left(BOUNDS, value)
        expected[index] = expected.get(index, 0) + 1
    counts = bucket_counts(BOUNDS, values)
    assert dict(counts) == expected
    assert len(counts) == len(expected)  # each touched bucket once


def breakdown(ttft_s: float, gaps: tuple[float, ...], queue_s: float | None) -> Breakdown:
    return Breakdown(
        e2e_s=ttft_s + sum(gaps) + 0.002,
        ttft_s=ttft_s,
        tpot_s=(sum(gaps) + 0.002) / len(gaps) if gaps else None,
        itl_s=gaps,
        network_s=0.001,
        queue_s=queue_s,
        prefill_s=None if queue_s is None else ttft_s / 2,
        decode_s=sum(gaps),
        detokenize_s=0.0,
        other_s=0.001,
        output_tokens=len(gaps) + 1,
    )


def registry_samples(metrics: MetricSet) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["premium", "standard"]),
            st.sampled_from(["ok", "ok", "timeout"]),
            st.floats(min_value=0, max_value=5, allow_nan=False),
            st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), max_size=40),
            st.booleans(),
        ),
        max_size=25,
    )
)
def test_batched_observations_equal_prometheus_observe(
    requests: list[tuple[str, str, float, list[float], bool]],
) -> None:
    """What `MetricSet.observe` batches is, once the registry is read, what `observe` gives."""
    assert_batched_equals_observe(requests)


def test_many_requests_between_reads_equal_prometheus_observe() -> None:
    rng = random.Random(11)
    requests = [
        (
            rng.choice(["premium", "standard"]),
            rng.choice(["ok", "ok", "ok", "timeout"]),
            rng.lognormvariate(-3, 1),
            [rng.lognormvariate(-4, 1) for _ in range(rng.randrange(40))],
            rng.random() < 0.5,
        )
        for _ in range(1500)
    ]
    assert_batched_equals_observe(requests)


def assert_batched_equals_observe(
    requests: list[tuple[str, str, float, list[float], bool]],
) -> None:
    spec = SLOSpec.default()
    batched = MetricSet(spec, "m", CollectorRegistry(auto_describe=True))
    reference = prometheus_client_metric_set(spec)
    route = "/v1/completions"
    for index, (tier, outcome, ttft_s, gaps, engine) in enumerate(requests):
        made = breakdown(ttft_s, tuple(gaps), 0.01 if engine else None)
        observed = made if outcome == "ok" else None
        counts = None  # counted by the caller (shared with the live windows) or by observe
        if index % 2 and observed is not None:
            counts = bucket_counts(batched.itl_bounds, observed.itl_s)
        batched.observe(
            settled_request(tier, route, outcome, input_tokens=7), observed, None, counts
        )
        # The reference: one prometheus_client call per value, as before batching.
        reference.requests.labels(tier=tier, model="m", route=route, outcome=outcome).inc()
        if observed is None:
            continue
        reference._bound(tier, route)  # every histogram's child exists from the first request
        labels = {"tier": tier, "model": "m", "route": route}
        for name in REQUEST_HISTOGRAMS:
            value = getattr(observed, f"{name}_s")
            if value is not None:
                reference.histograms[name].labels(**labels).observe(value)
        for gap in observed.itl_s:
            reference.histograms["itl"].labels(**labels).observe(gap)
        reference.histograms["input_tokens"].labels(**labels).observe(7)
        reference.histograms["output_tokens"].labels(**labels).observe(observed.output_tokens)
        reference.output_tokens_total.labels(**labels).inc(observed.output_tokens)
        if reference.goodput.good(tier, outcome, observed):  # the decision observe makes
            reference.good_requests.labels(**labels).inc()
    expected = registry_samples(reference)
    got = registry_samples(batched)  # reading the registry flushes what is pending
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_pending_observations_reach_the_metrics_without_a_read(monkeypatch: Any) -> None:
    metrics = MetricSet(SLOSpec.default(), "m", CollectorRegistry(auto_describe=True))
    child = metrics.requests.labels(tier="premium", model="m", route="/r", outcome="ok")
    metrics.observe(settled_request("premium", "/r"), None, None)  # the first one flushes at once
    assert child._value.get() == 1
    metrics.observe(settled_request("premium", "/r"), None, None)
    assert child._value.get() == 1  # waiting, at most FLUSH_EVERY_S
    monkeypatch.setattr(metrics, "_flush_at", 0.0)
    metrics.observe(settled_request("premium", "/r"), None, None)
    assert child._value.get() == 3


def prometheus_client_metric_set(spec: SLOSpec) -> MetricSet:
    """A MetricSet on prometheus_client's own histograms (what multiprocess mode uses): the
    reference our histograms must equal, sample for sample."""
    saved = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
    try:
        made = MetricSet(spec, "m", CollectorRegistry(auto_describe=True))
    finally:
        if saved is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    assert all(isinstance(metric, Histogram) for metric in made.histograms.values())
    return made


def test_our_histograms_expose_what_prometheus_client_does_exemplars_included() -> None:
    spec = SLOSpec.default()
    ours = MetricSet(spec, "m", CollectorRegistry(auto_describe=True))
    assert not any(isinstance(metric, Histogram) for metric in ours.histograms.values())
    reference = CollectorRegistry()
    theirs = Histogram(
        "llm_slo_time_to_first_token_seconds", "d", ["tier", "model", "route"],
        buckets=ours.histograms["ttft"].bounds, registry=reference,
    )  # fmt: skip
    trace = "ab" * 16
    for index in range(6):
        observed = breakdown(0.01 * index, (0.002,) * index, None)
        exemplar = trace if index == 2 else None
        ours.observe(settled_request("premium", "/r", input_tokens=3), observed, exemplar)
        theirs.labels(tier="premium", model="m", route="/r").observe(
            observed.ttft_s, {"trace_id": trace} if exemplar else None
        )
    text, _ = ours.exposition("application/openmetrics-text")
    expected = generate_openmetrics(reference).decode()
    for line in expected.splitlines():
        if line.startswith("llm_slo_time_to_first_token_seconds_bucket"):
            # Same le, count and exemplar (its timestamp aside) on every bucket.
            assert line.split(" # ")[0] in text.decode(), line
            if " # " in line:
                exemplar_head = line.split(" # ")[1].rsplit(" ", 1)[0]
                assert exemplar_head in text.decode(), line
