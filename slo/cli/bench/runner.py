"""Drive a planned run against an endpoint: arrivals, a live progress bar, records as they finish.

Each record is appended to the output file (and flushed) the moment its request finishes, so
an interrupted run (Ctrl-C, the duration limit) keeps everything measured so far. Requests
still in flight when the run stops are cancelled and left out: they have no e2e to report.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slo.cli.bench.client import Measurement, RequestSettings, measure
from slo.cli.bench.lean_http import LeanClient
from slo.cli.bench.profiles import PlannedRequest
from slo.errors import UsageError

if TYPE_CHECKING:
    from slo.cli.bench.client import Client


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
    run_number: int | None = None,
) -> RunResult:
    """Send the plan: at each request's offset (open loop) or `concurrency` at a time (closed).

    `stop_when(record, planned)` is asked after each finished request; True ends the run
    there (a step of the capacity search that can no longer pass), as the duration limit would.
    `run_number` numbers this run's records, one run of several (`--runs`).
    """
    import middleware.wire.reader  # noqa: F401  (imported by the first reply: not on the schedule)

    run = _Run(plan, settings, out, stop_when, _progress_bar(progress))
    run.number = run_number
    async with _client(base_url, settings.timeout_s, transport) as client:
        with run.bar, _no_collection_pauses():
            await run.drive(client, base_url, concurrency, duration_limit_s)
    run.result.elapsed_s = time.perf_counter() - run.start
    return run.result


@contextlib.contextmanager
def _no_collection_pauses() -> Iterator[None]:
    """No garbage-collection pause on the schedule. A full collection walks every object the
    process holds (the middleware, the CLI, their libraries: ~100 ms here, seen as sends
    that late). The run's own objects are mostly freed by reference counting; the cycles it
    leaves (a cancelled request's exception and frames) wait for the collection after it."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()  # what exists now is left out of every later collection
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


@contextlib.asynccontextmanager
async def _client(
    base_url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None
) -> AsyncIterator[Client]:
    """The lean client for plain http:// (it keeps a 200 req/s schedule on two cores; see
    `slo.cli.bench.lean_http`), httpx for https:// and for an injected transport."""
    if transport is None and base_url.startswith("http://"):
        lean = LeanClient(base_url)
        try:
            with contextlib.suppress(httpx.ConnectError):  # the first send says why
                await lean.open()
            yield lean
        finally:
            await lean.aclose()
        return
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s, transport=transport) as client:
        yield client


def _progress_bar(progress: bool) -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]slo bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[ttft]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (progress and console.is_terminal),
    )


class _Run:
    """One run's state: what was sent, what finished, what is still in flight."""

    def __init__(
        self,
        plan: list[PlannedRequest],
        settings: RequestSettings,
        out: IO[str] | None,
        stop_when: Callable[[dict[str, Any], PlannedRequest], bool] | None,
        bar: Progress,
    ) -> None:
        self.plan, self.settings, self.out, self.stop_when = plan, settings, out, stop_when
        self.result = RunResult(planned=len(plan), started_at=time.time())
        self.stop = asyncio.Event()
        self.live = _LiveTTFT()
        self.bar = bar
        self.task_id = bar.add_task("requests", total=len(plan), ttft=self.live.text())
        self.tasks: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.start = time.perf_counter()
        self.number: int | None = None

    def finished(self, measurement: Measurement) -> None:
        record = measurement.to_record(self.settings.model, self.number)
        self.result.records.append(record)
        if self.out is not None:
            self.out.write(_json_line(record))
            self.out.flush()
        self.live.add(measurement.ttft_s if measurement.outcome == "ok" else None)
        self.bar.update(self.task_id, advance=1, ttft=self.live.text())
        if self.stop_when is not None and self.stop_when(record, measurement.planned):
            self.stop.set()

    async def one(
        self,
        client: Client,
        base_url: str,
        planned: PlannedRequest,
        scheduled: float | None = None,
    ) -> None:
        if scheduled is not None:  # open loop: how late this send is, as it starts
            sent = time.perf_counter()
            self.result.late_s.append(max(0.0, sent - scheduled))
            self.result.sent_at.append(sent)
        self.in_flight += 1
        measurement = await measure(client, base_url, planned, self.settings, scheduled)
        self.in_flight -= 1  # not reached when cancelled: what is left was cut off
        self.finished(measurement)

    async def open_loop(self, client: Client, base_url: str) -> None:
        for planned in self.plan:
            due = self.start + planned.offset_s
            await _until(due)
            task = asyncio.create_task(self.one(client, base_url, planned, due))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    async def closed_loop(self, client: Client, base_url: str, width: int) -> None:
        pending: Iterator[PlannedRequest] = iter(self.plan)

        async def worker() -> None:
            for planned in pending:  # one shared iterator: each request is taken once
                await self.one(client, base_url, planned)

        workers = [asyncio.create_task(worker()) for _ in range(min(width, len(self.plan)))]
        self.tasks.update(workers)
        await asyncio.gather(*workers)

    async def drive(
        self, client: Client, base_url: str, concurrency: int | None, limit_s: float
    ) -> None:
        """Run the loop until it ends, the stop condition, the limit or an interrupt."""
        try:
            async with asyncio.timeout(limit_s):
                # The schedule starts now, not before the client was built (its TLS context
                # alone takes tens of milliseconds): no send starts late.
                self.start = time.perf_counter()
                loop = (
                    self.open_loop(client, base_url)
                    if concurrency is None
                    else self.closed_loop(client, base_url, concurrency)
                )
                work = asyncio.create_task(loop)
                stopper = asyncio.create_task(_wait(self.stop))
                try:
                    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    await _cancel({stopper} if work.done() else {work, stopper})
                if work.done() and not work.cancelled():
                    work.result()  # an error in the loop itself surfaces here
                else:
                    self.result.stopped_by = "stop condition"
        except TimeoutError:
            self.result.stopped_by = "duration limit"
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the main task
            self.result.stopped_by = "interrupt"
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        finally:
            await _cancel(self.tasks)
            self.result.cancelled_in_flight = self.in_flight


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


def open_output(path: Path, append: bool = False) -> IO[str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a" if append else "w", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--out {path}: cannot write ({error.strerror})") from None
