"""The engine's own state behind `slo proxy`: llama-server's `/metrics`, scraped by the proxy.

`slo proxy` scrapes its upstream's Prometheus `/metrics` (on by default at <upstream>/metrics)
into the engine gauges the bundled engine fills. llama-server here has one slot, and more
requests than that are kept in flight through the proxy, so at any moment one is processing
and the others are deferred (`llamacpp:requests_processing`, `llamacpp:requests_deferred`).
The proxy's own `/metrics` (`llm_slo_running_requests`, `llm_slo_queue_depth`) and the data
of `/slo.html`'s "Engine now" panel (the page's JSON, which it renders at load and refreshes
from `/slo?view=page`) must both show them while the burst runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slo.sli import CATALOG
from tests.helpers.llama_server_process import MODEL, proxied, tiny_gguf

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IN_FLIGHT = 4  # streams kept going against llama-server's one slot: up to 3 deferred
MAX_TOKENS = 100  # long enough to be deferred behind the others, short enough to be quick
DEADLINE_S = 30.0
POLL_S = 0.05
SCRAPE_INTERVAL = "0.5"  # seconds; the proxy's default (5 s) would make the test slow
RUNNING = CATALOG["running"].metric  # llm_slo_running_requests
QUEUE_DEPTH = CATALOG["queue_depth"].metric  # llm_slo_queue_depth


@dataclass
class Peaks:
    """The largest values seen at any one poll."""

    upstream: dict[str, float] = field(default_factory=dict)  # llama-server's own gauges
    metrics: dict[str, float] = field(default_factory=dict)  # the proxy's /metrics
    page: dict[str, float] = field(default_factory=dict)  # /slo.html's "Engine now" data
    polls: int = 0

    def note(self, where: str, name: str, value: float) -> None:
        seen = getattr(self, where)
        seen[name] = max(seen.get(name, 0.0), value)

    def complete(self) -> bool:
        """Each of the three has shown a request running and one deferred, at some poll."""
        seen = (self.upstream, self.metrics, self.page)
        return all(at.get(name, 0) > 0 for at in seen for name in ("running", "queue_depth"))


def gauge_total(exposition: str, name: str) -> float:
    """The sum of every sample of gauge `name` (any labels), parsed by prometheus_client."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == name
        for sample in family.samples
        if sample.name == name
    )


def page_engine(html: str) -> dict[str, Any] | None:
    """The "Engine now" data that /slo.html embeds and renders (`data.engine`)."""
    marker = '<script type="application/json" id="slo-data">'
    start = html.index(marker) + len(marker)
    data = json.loads(html[start : html.index("</script>", start)])
    return data["engine"]


async def poll(base_url: str, upstream: str, peaks: Peaks, stop: asyncio.Event) -> None:
    """Read llama-server's gauges, the proxy's and the page's until each has shown a request
    running and one deferred (or DEADLINE_S passed); then stop the burst."""
    try:
        await _poll_until_seen(base_url, upstream, peaks)
    finally:
        stop.set()


async def _poll_until_seen(base_url: str, upstream: str, peaks: Peaks) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        deadline = time.monotonic() + DEADLINE_S
        while not peaks.complete() and time.monotonic() < deadline:
            engine = (await http.get(upstream + "/metrics")).text
            peaks.note("upstream", "running", gauge_total(engine, "llamacpp:requests_processing"))
            peaks.note("upstream", "queue_depth", gauge_total(engine, "llamacpp:requests_deferred"))
            ours = (await http.get(base_url + "/metrics")).text
            peaks.note("metrics", "running", gauge_total(ours, RUNNING))
            peaks.note("metrics", "queue_depth", gauge_total(ours, QUEUE_DEPTH))
            shown = page_engine((await http.get(base_url + "/slo.html")).text) or {}
            peaks.note("page", "running", float(shown.get("running") or 0))
            peaks.note("page", "queue_depth", float(sum((shown.get("queue_depth") or {}).values())))
            peaks.polls += 1
            await asyncio.sleep(POLL_S)


async def keep_busy(base_url: str, stop: asyncio.Event) -> int:
    """IN_FLIGHT streams at a time through the proxy until `stop`; returns how many ended."""
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    messages = [{"role": "user", "content": "Keep going."}]

    async def worker() -> int:
        done = 0
        while not stop.is_set():
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=MAX_TOKENS, stream=True
            )
            async for _chunk in stream:
                pass
            done += 1
        return done

    try:
        return sum(await asyncio.gather(*(worker() for _ in range(IN_FLIGHT))))
    finally:
        await client.close()


async def burst(base_url: str, upstream: str) -> tuple[Peaks, int]:
    peaks, stop = Peaks(), asyncio.Event()
    _, finished = await asyncio.gather(
        poll(base_url, upstream, peaks, stop), keep_busy(base_url, stop)
    )
    return peaks, finished


def test_proxy_metrics_and_engine_now_show_llama_servers_running_and_deferred(
    tmp_path: Path,
) -> None:
    gguf = tiny_gguf(tmp_path)
    db = tmp_path / "records.db"
    # --upstream-metrics is on by default, at <upstream>/metrics: only the interval is set.
    with proxied(gguf, tmp_path, db, 1, "--upstream-metrics-interval", SCRAPE_INTERVAL) as served:
        peaks, finished = asyncio.run(burst(served.base_url, served.upstream))
    where = f"{peaks} after {finished} requests; proxy log:\n{(tmp_path / 'proxy.log').read_text()}"
    # The premise: llama-server itself had a request processing and others deferred.
    assert peaks.upstream.get("running", 0) > 0, where
    assert peaks.upstream.get("queue_depth", 0) > 0, where
    # llama-server has one slot: the proxy may never show more running than that.
    assert peaks.metrics["running"] == 1 and peaks.page["running"] == 1, where
    assert peaks.metrics["queue_depth"] > 0 and peaks.page["queue_depth"] > 0, where
