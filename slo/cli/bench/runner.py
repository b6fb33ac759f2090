"""Drive a planned run against an endpoint: arrivals, a live progress bar, records as they finish.

Each record is appended to the output file (and flushed) the moment its request finishes, so
an interrupted run (Ctrl-C, the duration limit) keeps everything measured so far. Requests
still in flight when the run stops are cancelled and left out: they have no e2e to report.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slo.cli.bench.client import Measurement, RequestSettings, measure
from slo.cli.bench.profiles import PlannedRequest
from slo.errors import UsageError


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int | None


def fetch_model_info(base_url: str, model: str | None, timeout_s: float = 10.0) -> ModelInfo:
    """The model to ask for and its context length, from `/v1/models` (vLLM and ours list
    `max_model_len`; others may not, and then the caller's fallback applies)."""
    try:
        response = httpx.get(base_url + "/v1/models", timeout=timeout_s)
        response.raise_for_status()
        listed = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        if model is None:
            raise UsageError(
                f"--url {base_url}: cannot list models at /v1/models ({error}); "
                "is the server up? pass --model NAME to skip the lookup"
            ) from None
        return ModelInfo(model, None)
    entries = [entry for entry in listed if isinstance(entry, dict) and "id" in entry]
    if model is None:
        if not entries:
            raise UsageError(f"--url {base_url}: /v1/models lists no model; pass --model NAME")
        entry = entries[0]
    else:
        entry = next((e for e in entries if e["id"] == model), {"id": model})
    max_len = entry.get("max_model_len")
    return ModelInfo(str(entry["id"]), max_len if isinstance(max_len, int) else None)


@dataclass
class RunResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0  # wall clock
    elapsed_s: float = 0.0
    planned: int = 0
    cancelled_in_flight: int = 0
    stopped_by: str | None = None  # None, "duration limit", "interrupt" or "stop condition"
    late_s: list[float] = field(default_factory=list)  # per open-loop send, after its schedule
    sent_at: list[float] = field(default_factory=list)  # perf_counter of each open-loop send


class _LiveTTFT:
    """Sorted client TTFTs for the progress bar's p50/p95 (nearest rank, as in `slo check`)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, value: float | None) -> None:
        if value is not None:
            bisect.insort(self.values, value)

    def text(self) -> str:
        if not self.values:
            return "TTFT p50 -  p95 -"
        ranks = [max(1, math.ceil(q * len(self.values))) - 1 for q in (0.50, 0.95)]
        p50, p95 = (self.values[r] * 1e3 for r in ranks)
        return f"TTFT p50 {p50:.0f} ms  p95 {p95:.0f} ms"


async def run_plan(
    base_url: str,
    plan: list[PlannedRequest],
    settings: RequestSettings,
    *,
    concurrency: int | None,
    duration_limit_s: float,
    out: IO[str] | None,
    progress: bool,
    transport: httpx.AsyncBaseTransport | None = None,
    stop_when: Callable[[dict[str, Any], PlannedRequest], bool] | None = None,
) -> RunResult:
    """Send the plan: at each request's offset (open loop) or `concurrency` at a time (closed).

    `stop_when(record, planned)` is asked after each finished request; True ends the run there (a step
    of the capacity search that can no longer pass), as the duration limit would.
    """
    import middleware.wire  # noqa: F401  (imported by the first reply: not on the schedule)

    result = RunResult(planned=len(plan), started_at=time.time())
    stop = asyncio.Event()
    live = _LiveTTFT()
    start = time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("[bold]slo bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[ttft]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (progress and console.is_terminal),
    )
    task_id = bar.add_task("requests", total=len(plan), ttft=live.text())
    tasks: set[asyncio.Task[None]] = set()

    def finished(measurement: Measurement) -> None:
        record = measurement.to_record(settings.model)
        result.records.append(record)
        if out is not None:
            out.write(_json_line(record))
            out.flush()
        live.add(measurement.ttft_s if measurement.outcome == "ok" else None)
        bar.update(task_id, advance=1, ttft=live.text())
        if stop_when is not None and stop_when(record, measurement.planned):
            stop.set()

    async with httpx.AsyncClient(
        limits=limits, timeout=settings.timeout_s, transport=transport
    ) as client:
        in_flight = 0

        async def one(planned: PlannedRequest, scheduled: float | None = None) -> None:
            nonlocal in_flight
            if scheduled is not None:  # open loop: how late this send is, as it starts
                sent = time.perf_counter()
                result.late_s.append(max(0.0, sent - scheduled))
                result.sent_at.append(sent)
            in_flight += 1
            measurement = await measure(client, base_url, planned, settings)
            in_flight -= 1  # not reached when cancelled: what is left was cut off
            finished(measurement)

        async def open_loop() -> None:
            for planned in plan:
                await _until(start + planned.offset_s)
                task = asyncio.create_task(one(planned, start + planned.offset_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))

        async def closed_loop(width: int) -> None:
            pending: Iterator[PlannedRequest] = iter(plan)

            async def worker() -> None:
                for planned in pending:  # one shared iterator: each request is taken once
                    await one(planned)

            workers = [asyncio.create_task(worker()) for _ in range(min(width, len(plan)))]
            tasks.update(workers)
            await asyncio.gather(*workers)

        with bar:
            try:
                async with asyncio.timeout(duration_limit_s):
                    # The schedule starts now, not before the client was built (its TLS
                    # context alone takes tens of milliseconds): no send starts late.
                    start = time.perf_counter()
                    work = asyncio.create_task(
                        open_loop() if concurrency is None else closed_loop(concurrency)
                    )
                    stopper = asyncio.create_task(_wait(stop))
                    try:
                        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        await _cancel({stopper} if work.done() else {work, stopper})
                    if work.done() and not work.cancelled():
                        work.result()  # an error in the loop itself surfaces here
                    else:
                        result.stopped_by = "stop condition"
            except TimeoutError:
                result.stopped_by = "duration limit"
            except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the main task
                result.stopped_by = "interrupt"
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            finally:
                await _cancel(tasks)
                result.cancelled_in_flight = in_flight
    result.elapsed_s = time.perf_counter() - start
    return result


# asyncio's sleep wakes up to ~1 ms late (epoll waits in whole milliseconds): sleep until
# shortly before the send, then yield to the other tasks (responses being read) until it is due.
SPIN_S = 0.0015


async def _until(deadline: float) -> None:
    """Return at `deadline` (perf_counter), not a millisecond after."""
    delay = deadline - time.perf_counter()
    if delay > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


async def _wait(event: asyncio.Event) -> None:
    await event.wait()


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel what is still running and wait until it has stopped."""
    running = [task for task in tasks if not task.done()]
    for task in running:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*running, return_exceptions=True)


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def open_output(path: Path) -> IO[str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--out {path}: cannot write ({error.strerror})") from None
