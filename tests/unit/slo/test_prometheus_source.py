"""`slo check --prometheus`: the same objectives from histogram buckets, via a fake HTTP API."""

from __future__ import annotations

import re

import httpx
import pytest

from slo.check.prometheus_source import PrometheusReader, bucket_quantile, evaluate_prometheus
from slo.errors import UsageError
from slo.spec import SLOSpec
from tests.helpers.tier_specs import make_tier, spec

SPEC = spec(
    make_tier("premium", "p95 ttft <= 200ms", "availability >= 99%", "goodput >= 90%", match=None),
    window=None,
)
# 1000 requests: 960 within 200 ms, all but 5 ok (3 client errors do not count); 898 of the
# 997 counted met every latency objective: goodput 90% exactly needs ceil(897.3) = 898.
TTFT_BUCKETS = {"0.1": 700, "0.2": 960, "0.5": 995, "+Inf": 1000}
OUTCOMES = {"ok": 992, "server_error": 5, "client_error": 3}
GOOD_REQUESTS = 898


def handler(request: httpx.Request, good: int | None = GOOD_REQUESTS) -> httpx.Response:
    query = request.url.params["query"]
    if "llm_slo_good_requests_total" in query:
        result = [] if good is None else [{"metric": {}, "value": [0, str(good)]}]
    elif "_bucket" in query:
        counts = TTFT_BUCKETS if "time_to_first_token" in query else {"+Inf": 0}
        result = [{"metric": {"le": le}, "value": [0, str(v)]} for le, v in counts.items()]
    elif "by (outcome)" in query:
        result = [{"metric": {"outcome": k}, "value": [0, str(v)]} for k, v in OUTCOMES.items()]
    else:
        result = [{"metric": {}, "value": [0, "50000"]}]
    assert re.search(r'tier="premium"', query)
    return httpx.Response(200, json={"status": "success", "data": {"result": result}})


def reader(handle=handler) -> PrometheusReader:  # type: ignore[no-untyped-def]
    return PrometheusReader("http://prom", httpx.Client(transport=httpx.MockTransport(handle)))


def test_objectives_from_buckets_and_outcome_counters() -> None:
    report = evaluate_prometheus(SPEC, reader())
    ttft, availability, goodput = report.results
    assert (ttft.events, ttft.good, ttft.verdict) == (1000, 960, "met")
    assert ttft.observed_s == pytest.approx(0.1 + 0.1 * (950 - 700) / 260)
    assert (availability.events, availability.good, availability.verdict) == (997, 992, "met")
    assert (goodput.events, goodput.good, goodput.verdict) == (997, 898, "met")
    # Every alert window reads the same counts here: 99 bad of 997, a burn rate just under 1.
    assert [burn.burn_rate for burn in goodput.burn] == [pytest.approx(99 / 997 / 0.1)] * len(
        SPEC.alert_policy.windows_s
    )
    assert report.tiers[0].performance.ttft_p95_s == pytest.approx(ttft.observed_s)


def test_goodput_from_the_good_requests_counter_one_below_the_target() -> None:
    report = evaluate_prometheus(SPEC, reader(lambda r: handler(r, GOOD_REQUESTS - 1)))
    goodput = report.results[2]
    assert (goodput.events, goodput.good, goodput.verdict) == (997, 897, "violated")


def test_goodput_without_a_good_requests_series_is_insufficient_data_with_a_note() -> None:
    report = evaluate_prometheus(SPEC, reader(lambda r: handler(r, None)))
    goodput = report.results[2]
    assert (goodput.events, goodput.good, goodput.verdict) == (0, 0, "insufficient_data")
    assert report.notes[-1] == (
        "no llm_slo_good_requests_total series for tier 'premium': its goodput is "
        "insufficient data (the middleware exports the counter from 0)"
    )
    assert report.results[1].verdict == "met"  # availability is still judged


def test_threshold_must_be_a_bucket_boundary() -> None:
    spec = SLOSpec.from_yaml("tiers:\n- name: premium\n  objectives: [p95 ttft <= 300ms]\n")
    with pytest.raises(UsageError, match=r"0\.3s is not a bucket boundary"):
        evaluate_prometheus(spec, reader())


def test_unreachable_prometheus_is_a_usage_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(UsageError, match="cannot query Prometheus at http://prom"):
        evaluate_prometheus(SPEC, reader(refuse))


def test_bucket_quantile_like_histogram_quantile() -> None:
    buckets = [(0.1, 50.0), (0.2, 100.0), (float("inf"), 100.0)]
    assert bucket_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert bucket_quantile(buckets, 0.75) == pytest.approx(0.15)
    assert bucket_quantile([], 0.5) is None


def test_every_query_at_the_reports_instant() -> None:
    """Good and total events come from the same samples: one evaluation time for all queries."""
    times: list[str | None] = []

    def record_time(request: httpx.Request) -> httpx.Response:
        times.append(request.url.params.get("time"))
        return handler(request)

    report = evaluate_prometheus(SPEC, reader(record_time), now=1_800_000_000.25)
    assert report.now == 1_800_000_000.25
    assert len(times) > 3 and set(times) == {"1800000000.250"}
    times.clear()
    evaluate_prometheus(SPEC, reader(record_time))  # no instant given: the server's now
    assert set(times) == {None}
