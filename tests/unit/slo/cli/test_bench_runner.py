"""The run loop: every planned request once, records written as they finish, clean stops."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import httpx

from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import get_profile, plan_requests
from slo.cli.bench.runner import run_plan

SETTINGS = RequestSettings("m", "completions")


def planned(count: int, rate: float | None = None) -> list:
    return plan_requests(get_profile("code"), count, seed=1, max_model_len=512, rate=rate)


def reply(request: httpx.Request) -> bytes:
    index = json.loads(request.content)["prompt"].split("]")[0].lstrip("[")
    chunk = {"choices": [{"index": 0, "text": f"r{index}", "finish_reason": "length"}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


def run(handler: Any, plan: list, **kwargs: Any) -> tuple[Any, list[dict]]:
    out = io.StringIO()
    arguments = {"concurrency": None, "duration_limit_s": 60.0, "progress": False, **kwargs}
    result = asyncio.run(
        run_plan("http://server", plan, SETTINGS, out=out,
                 transport=httpx.MockTransport(handler), **arguments)
    )  # fmt: skip
    return result, [json.loads(line) for line in out.getvalue().splitlines()]


def test_closed_loop_sends_every_request_exactly_once() -> None:
    prompts: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        prompts.append(json.loads(request.content)["prompt"])
        await asyncio.sleep(0)
        return httpx.Response(200, content=reply(request))

    plan = planned(25)
    result, lines = run(handler, plan, concurrency=4)
    assert sorted(prompts) == sorted(p.prompt for p in plan)
    assert result.stopped_by is None and len(result.records) == 25 == len(lines)
    assert lines == result.records


def test_open_loop_sends_at_the_planned_offsets() -> None:
    plan = planned(6, rate=1000.0)  # offsets of about a millisecond: the loop waits for each

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=reply(request))

    result, lines = run(handler, plan)
    assert len(lines) == 6 and result.cancelled_in_flight == 0


def test_the_duration_limit_keeps_what_finished_and_cancels_the_rest() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if "[2]" in json.loads(request.content)["prompt"]:
            await asyncio.sleep(60)  # hangs: the limit must end the run
        return httpx.Response(200, content=reply(request))

    result, lines = run(handler, planned(5), concurrency=1, duration_limit_s=0.3)
    assert result.stopped_by == "duration limit"
    assert len(lines) == 2 and result.cancelled_in_flight == 1


def test_an_interrupt_returns_what_was_measured() -> None:
    gate = asyncio.Event

    async def main() -> tuple[Any, str]:
        first_done = gate()
        out = io.StringIO()

        async def handler(request: httpx.Request) -> httpx.Response:
            if "[0]" not in json.loads(request.content)["prompt"]:
                first_done.set()
                await asyncio.sleep(60)
            return httpx.Response(200, content=reply(request))

        task = asyncio.create_task(
            run_plan("http://server", planned(4), SETTINGS, concurrency=2, duration_limit_s=60,
                     out=out, progress=False, transport=httpx.MockTransport(handler))
        )  # fmt: skip
        await first_done.wait()
        await asyncio.sleep(0.05)
        task.cancel()  # what asyncio.run does on Ctrl-C
        return await task, out.getvalue()

    result, written = asyncio.run(main())
    assert result.stopped_by == "interrupt"
    assert len(written.splitlines()) == 1 == len(result.records)
