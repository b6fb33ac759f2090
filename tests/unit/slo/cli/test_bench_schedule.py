"""Open-loop latencies from the schedule: a client that falls behind cannot hide the wait."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import httpx

from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import get_profile, plan_requests
from slo.cli.bench.runner import run_plan
from slo.cli.bench.schedule import (
    DIFFER_FLOOR_S,
    DIFFER_SHARE,
    differences,
    latencies,
    percentile,
    render_schedule,
)

SETTINGS = RequestSettings("m", "completions")


def words(text: str) -> str:
    """The text with its line breaks (the console's wrapping) read as spaces."""
    return " ".join(text.split())


# Each answer holds the client's event loop this long, as a client busy with its own work
# would: the sends due meanwhile go out late, by at least this much each.
BLOCK_S = 0.030


def answer(request: httpx.Request) -> httpx.Response:
    time.sleep(BLOCK_S)  # not asyncio.sleep: nothing else runs on the client's loop meanwhile
    chunk = {"choices": [{"index": 0, "text": "tok", "finish_reason": "length"}]}
    body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    return httpx.Response(200, content=body)


def run(plan: list, concurrency: int | None = None) -> list[dict[str, Any]]:
    out = io.StringIO()
    asyncio.run(
        run_plan(
            "http://server",
            plan,
            SETTINGS,
            concurrency=concurrency,
            duration_limit_s=60.0,
            out=out,
            progress=False,
            transport=httpx.MockTransport(answer),
        )
    )
    return [json.loads(line) for line in out.getvalue().splitlines()]


def open_loop_plan(count: int) -> list:
    # Constant arrivals 1 ms apart: each request is due long before the one ahead lets go.
    profile = get_profile("code")
    return plan_requests(profile, count, seed=1, max_model_len=512, rate=1000.0, arrival="constant")


def test_a_client_that_falls_behind_shows_the_wait_from_the_schedule() -> None:
    plan = open_loop_plan(8)
    records = sorted(run(plan), key=lambda record: record["request_id"])
    assert len(records) == 8
    lags = {int(r["request_id"].split("-")[1]): r["client_send_lag_s"] for r in records}
    for index, lag in lags.items():
        if index:  # due at its offset, it could not go out before the first answer let go
            assert lag >= BLOCK_S - plan[index].offset_s - 1e-6, (index, lags)
    for field in ("client_ttft_s", "client_e2e_s"):
        sent = latencies(records, field, from_schedule=False)
        due = latencies(records, field, from_schedule=True)
        assert (due >= sent).all()
        assert (percentile(due, 0.95) or 0.0) > (percentile(sent, 0.95) or 0.0)
    text = words(render_schedule(records))
    assert "per tier, from the scheduled send" in text
    assert "the client sent late" in text and "coordinated omission" in text
    assert "standard TTFT p" in text and "from the schedule" in text


def test_a_closed_loop_run_has_no_schedule_and_no_second_view() -> None:
    plan = plan_requests(get_profile("code"), 3, seed=1, max_model_len=512, rate=None)
    records = run(plan, concurrency=1)
    assert len(records) == 3
    assert all("client_send_lag_s" not in record for record in records)
    assert render_schedule(records) == ""


def record(index: int, ttft: float, lag: float, tier: str = "standard") -> dict[str, Any]:
    return {
        "request_id": f"r{index}",
        "tier": tier,
        "outcome": "ok",
        "client_ttft_s": ttft,
        "client_e2e_s": ttft + 1.0,
        "client_send_lag_s": lag,
    }


def test_the_views_differ_past_both_the_floor_and_the_share() -> None:
    fast = 2 * DIFFER_FLOOR_S  # 10% of it is under the floor: the floor decides
    under_floor = DIFFER_FLOOR_S * 0.9
    assert differences([record(i, fast, under_floor) for i in range(20)]) == []
    over_floor = DIFFER_FLOOR_S * 1.5
    slow = over_floor / DIFFER_SHARE * 2  # the lag is under 10% of it: the share decides
    assert differences([record(i, slow, over_floor) for i in range(20)]) == []
    found = differences([record(i, fast, over_floor) for i in range(20)])
    assert len(found) == 1 and found[0].startswith("standard TTFT p")  # e2e is 1 s longer
    text = words(render_schedule([record(i, fast, over_floor) for i in range(20)]))
    assert "the client sent late" in text and found[0] in text


def test_a_kept_schedule_is_said_and_failed_requests_stay_out() -> None:
    rows = [record(i, 0.1, 0.0005) for i in range(10)]
    rows.append({**record(10, 5.0, 3.0), "outcome": "timeout"})  # not an answer: left out
    assert latencies(rows, "client_ttft_s", from_schedule=True).size == 10
    text = words(render_schedule(rows))
    assert "the client kept its schedule" in text and "sent late" not in text
