"""The on-call page's JSON (`/slo?view=page`): worst first, burn table, series, phases, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from engine.hooks import StepStats
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.live.page import observed_text, respond
from middleware.metrics.metric_set import MetricSet
from middleware.request.timeline import Breakdown
from slo.arithmetic import budget_remaining, burn_rate
from slo.spec import SLOSpec
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

# Standard comes first in the spec; premium is the one made to burn, so "worst first" must
# reorder them.
SPEC = spec_yaml(
    make_tier("standard", "p90 ttft <= 1s", priority=1, default=True),
    make_tier("premium", "p90 ttft <= 200ms", "availability >= 90%", priority=0),
    min_events=1,
    alert_policy=burn_policy(burn_alert("page", "10m", "1m", 2), thresholds=()),
)


def breakdown(ttft_s: float) -> Breakdown:
    return Breakdown(
        e2e_s=ttft_s + 0.1, ttft_s=ttft_s, tpot_s=0.01, itl_s=(0.01,), network_s=0.002,
        queue_s=0.01, prefill_s=ttft_s - 0.01, decode_s=0.08, detokenize_s=0.008,
        other_s=0.0, output_tokens=2,
    )  # fmt: skip


def page(live: LiveSLO, query: str = "view=page", metrics: Any = None) -> dict[str, Any]:
    code, content_type, body = respond(live, False, query, metrics)
    assert (code, content_type) == (200, "application/json"), body
    return dict(json.loads(body))


@pytest.fixture
def live() -> LiveSLO:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    for _ in range(10):  # both tiers healthy for a minute
        live.observe("standard", "ok", breakdown(0.1))
        live.observe("premium", "ok", breakdown(0.1))
        clock.advance_ms(6000)
    clock.advance_ms(60_000)  # the last minute holds only the slow requests
    for _ in range(10):  # then premium slows down: every first token late
        live.observe("premium", "ok", breakdown(0.5))
        clock.advance_ms(1000)
    return live


def test_the_burning_tier_and_its_firing_alert_come_first(live: LiveSLO) -> None:
    data = page(live)
    assert [t["tier"] for t in data["tiers"]] == ["premium", "standard"]
    assert data["overview"][0]["tier"] == "premium"
    assert data["overview"][0]["state"] == "firing"
    assert data["overview"][-1]["tier"] == "standard"
    assert data["overview"][-1]["state"] == "met"
    assert [a["alertname"] for a in data["alerts"]] == ["LLMSLOTTFTBudgetBurn"]
    assert data["alerts"][0]["runbook"] == "runbooks/LLMSLOTTFTBudgetBurn.md"


def test_burn_table_and_headline_use_the_slo_arithmetic(live: LiveSLO) -> None:
    premium = page(live)["tiers"][0]
    ttft = next(o for o in premium["objectives"] if "ttft" in o["objective"])
    assert premium["headline"] == ttft["objective"]
    assert ttft["budget_left"] == budget_remaining(10, 20, 0.9)
    (row,) = ttft["burn_table"]
    assert row["state"] == "firing"
    assert row["long_rate"] == burn_rate(10, 20, 0.9)
    assert row["short_rate"] == burn_rate(10, 10, 0.9)  # the last minute: only slow ones
    text = ttft["observed_text"]
    assert text.startswith("p90 TTFT ") and text.endswith("/ 200 ms")


def test_series_and_phases_are_read_back_from_the_windows(live: LiveSLO) -> None:
    data = page(live, "view=page&range=10m")
    assert data["range"] == "10m" and data["slot_s"] == 10.0
    premium = data["tiers"][0]
    ttft = next(o for o in premium["objectives"] if "ttft" in o["objective"])
    series = ttft["series"]
    assert len(series["events"]) == 60 and sum(series["events"]) == 20
    known = [v for v in series["sli"] if v is not None]
    assert known[0] == 1.0 and known[-1] == 0.0  # healthy first, then every request late
    assert series["budget"][-1] == pytest.approx(budget_remaining(10, 20, 0.9))
    assert max(v for v in series["percentile"] if v is not None) > 0.2
    phases = premium["phases"]
    assert phases["window"] == "1m" and phases["requests"] == 10  # the shortest window
    assert phases["mean_s"]["prefill"] == pytest.approx(0.49)
    assert phases["mean_s"]["queue_prefill"] == 0.0


def test_engine_gauges_show_when_the_engine_reports_a_step(live: LiveSLO) -> None:
    metrics = MetricSet(live.spec, "tiny", CollectorRegistry())
    assert page(live, metrics=metrics)["engine"] is None

    step = StepStats(
        step=1, time_ns=0, step_time_s=0.01, batch_size=3, prefill_tokens=0, decode_tokens=3,
        num_waiting=5, num_running=3, num_preempted=0, kv_blocks_total=8, kv_blocks_free=6,
        waiting_by_priority={0: 4, 1: 1},
    )  # fmt: skip
    metrics.observe_engine_step(step)
    data = page(live, metrics=metrics)
    assert data["engine"]["batch_size"] == 3 and data["engine"]["queue_depth"]["premium"] == 4
    assert data["tiers"][0]["queue_depth"] == 4


@pytest.mark.parametrize(
    ("query", "parameter"),
    [("view=chart", "view"), ("view=page&range=2h", "range"), ("range=fast", "range"),
     ("verbose=1", "verbose")],
)  # fmt: skip
def test_bad_queries_get_a_400_naming_the_parameter(
    live: LiveSLO, query: str, parameter: str
) -> None:
    code, content_type, body = respond(live, False, query)
    answer = json.loads(body)
    assert (code, content_type, answer["parameter"]) == (400, "application/json", parameter)
    assert answer["error"].startswith("/slo: ") and parameter in answer["error"]
    if parameter != "view":
        assert "1m, 10m, 1h" in answer["error"]  # the ranges it could have asked for


def test_the_api_keeps_its_shape_and_the_page_inlines_its_data(live: LiveSLO) -> None:
    assert set(page(live, "")) == {"window", "evaluated_at", "tiers", "alerts"}
    code, content_type, body = respond(live, True, "range=1m")
    html = body.decode()
    assert code == 200 and content_type.startswith("text/html")
    assert '"range": "1m"' in html and "__SLO_PAGE_DATA__" not in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html


def test_observed_text_of_availability() -> None:
    spec = SLOSpec.from_yaml(SPEC)
    availability = spec.tier("premium").objectives[1]
    status = {"attainment": 0.9876}
    assert observed_text(availability, status) == "availability 98.76% / 90%"


def test_burn_table_honours_the_request_rate_guard() -> None:
    """The same traffic as above under a spec asking every window for 1 request/s: the guard
    keeps the page from firing, and the burn table says so (burning, not firing), as the live
    alerts and the generated rules judge it."""
    guarded = SLOSpec.from_yaml(
        spec_yaml(
            make_tier("standard", "p90 ttft <= 1s", priority=1, default=True),
            make_tier("premium", "p90 ttft <= 200ms", priority=0),
            min_events=1,
            alert_policy={
                **burn_policy(burn_alert("page", "10m", "1m", 2), thresholds=()),
                "min_request_rate": 1.0,
            },
        )
    )
    clock = ScriptedClock()
    live = LiveSLO(guarded, clock=clock)
    for _ in range(10):
        live.observe("premium", "ok", breakdown(0.1))
        clock.advance_ms(6000)
    clock.advance_ms(60_000)
    for _ in range(10):
        live.observe("premium", "ok", breakdown(0.5))
        clock.advance_ms(1000)
    premium = page(live)["tiers"][0]
    (row,) = next(o for o in premium["objectives"] if "ttft" in o["objective"])["burn_table"]
    assert row["state"] == "burning"  # 20 events in 10 min is under 1/s: the guard holds
    assert live.firing_alerts() == []
