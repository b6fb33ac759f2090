"""A real Prometheus counts every request from the first scrape: the series exist at 0 before
traffic, so `increase()` over a window that starts before the first request sees them all (the
issue's failure: children born with their first requests, 8 of 80 requests seen)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from middleware import LatencyMiddleware
from slo.sli import CATALOG
from tests.helpers.polling import wait_until
from tests.helpers.prometheus_process import prometheus, query
from tests.helpers.servers import uvicorn_thread
from tests.helpers.tier_specs import make_tier, spec_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = spec_yaml(
    make_tier("premium", "p95 ttft <= 250ms"),
    make_tier("batch", "p95 e2e <= 30s"),
    make_tier("standard", "availability >= 99%", default=True),
)
# The traffic: 80 mixed-tier requests, of which Prometheus saw 8.
TRAFFIC = {"premium": 24, "standard": 37, "batch": 19}
ROUTES = ("/v1/completions", "/v1/chat/completions")


async def complete(request: Request) -> JSONResponse:
    if request.headers.get("x-bad-request"):
        return JSONResponse({"error": {"message": "bad"}}, status_code=400)
    return JSONResponse(
        {
            "choices": [{"text": "hi there"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    )


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def test_increase_counts_every_request_from_the_first_scrape(tmp_path: Path) -> None:
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    app = LatencyMiddleware(
        Starlette(
            routes=[
                *(Route(route, complete, methods=["POST"]) for route in ROUTES),
                Route("/health", health),
            ]
        ),
        spec=spec_path,
        store=None,
        model="m",
    )
    requests = CATALOG["requests"].metric
    e2e_count = CATALOG["e2e"].metric + "_count"
    with (
        uvicorn_thread(app) as base_url,
        prometheus(tmp_path, [base_url.removeprefix("http://")]) as prom,
    ):
        # Scraped (at least twice) before the first request: the window starts before it.
        wait_until(
            lambda: bool(query(prom, "count_over_time(up[1m]) >= 2")),
            60,
            "two scrapes of the server",
        )
        sent = {tier: 0 for tier in TRAFFIC}
        ok = {tier: 0 for tier in TRAFFIC}
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for index in range(max(TRAFFIC.values())):
                for tier, count in TRAFFIC.items():
                    if index >= count:
                        continue
                    bad = index % 7 == 3  # some client errors: every outcome child counts
                    headers = {"x-llm-tier": tier, **({"x-bad-request": "1"} if bad else {})}
                    response = client.post(ROUTES[index % 2], headers=headers, json={})
                    assert response.status_code == (400 if bad else 200)
                    sent[tier] += 1
                    ok[tier] += not bad
        total = sum(sent.values())

        def scraped_all() -> bool:
            result = query(prom, f"sum({requests})")
            return bool(result) and float(result[0]["value"][1]) == total

        wait_until(scraped_all, 30, f"sum({requests}) == {total}")
        # At the last scrape's time, increase() does not extrapolate past the newest sample,
        # and a first sample of 0 stops it extrapolating before the oldest: exact counts.
        at = float(query(prom, "timestamp(up)")[0]["value"][1])
        seen = {
            series["metric"]["tier"]: float(series["value"][1])
            for series in query(prom, f"sum by (tier) (increase({requests}[5m]))", at)
        }
        assert seen == {tier: float(count) for tier, count in sent.items()}
        observed = {
            series["metric"]["tier"]: float(series["value"][1])
            for series in query(prom, f"sum by (tier) (increase({e2e_count}[5m]))", at)
        }
        assert observed == {tier: float(count) for tier, count in ok.items()}
    app.close()
