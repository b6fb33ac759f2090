"""One benchmark request against an OpenAI-compatible endpoint, timed at the client.

Definitions (the catalog's, as in `vllm bench serve`; every time from one `perf_counter`
taken just before the request is sent):
- TTFT: until the first chunk carrying output text (a chat role-only chunk is not output).
  A reply with no text at all (every token an incomplete UTF-8 sequence) takes the chunk
  that carries its finish_reason, which is where the server puts its first token.
- ITL: the gap between consecutive chunks carrying text; a chunk with several tokens is one
  gap, as vLLM counts it.
- e2e: until the last byte of the response is read. vLLM stops at its last text chunk; we
  read to the end so client e2e and the server's e2e (last byte sent) span the same
  request, and their difference is time on the wire and in the client's network stack.
- TPOT: (e2e - ttft) / (output_tokens - 1), output tokens from the response's usage.

Open loop, each request also has a scheduled send time. `client_send_lag_s` is how long after
it the request went out (the `perf_counter` above); TTFT and e2e from the schedule are the
client's values plus that lag (coordinated omission: a client that fell behind hides its
wait from the times measured from the send; docs/bench.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from slo.cli.bench.profiles import PlannedRequest
from slo.cli.bench.timings import PHASES, parse_server_timing, parse_timings_comment
from slo.sli import outcome_for_status

if TYPE_CHECKING:
    from middleware.wire.reader import WireReader
    from slo.cli.bench.lean_http import LeanClient, LeanResponse

    # What sends: httpx, or the lean client for plain http:// (the same calls and errors).
    Client = httpx.AsyncClient | LeanClient

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class RequestSettings:
    model: str
    endpoint: str  # "chat" or "completions"
    stream: bool = True
    ignore_eos: bool = True
    tier_header: str = "x-llm-tier"
    seed: int | None = None
    timeout_s: float = 300.0


@dataclass
class Measurement:
    planned: PlannedRequest
    timestamp: float  # wall clock at send
    route: str
    stream: bool
    status: int = 0
    outcome: str = "ok"
    error: str | None = None
    request_id: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    text_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    server: dict[str, Any] = field(default_factory=dict)
    send_lag_s: float | None = None  # open loop: the send's delay after its scheduled time

    @property
    def output_tokens(self) -> int:
        for count in (self.completion_tokens, self.server.get("output_tokens")):
            if isinstance(count, int):
                return count
        return self.text_chunks

    def to_record(self, model: str, run: int | None = None) -> dict[str, Any]:
        """One JSONL record: the server's view (where it sent timings) plus the client's;
        `run` numbers the run of a repeated benchmark (`--runs`)."""
        server = self.server
        tokens = self.output_tokens
        local_id = (
            f"bench-{self.planned.index}" if run is None else f"bench-{run}-{self.planned.index}"
        )
        record: dict[str, Any] = {
            "request_id": self.request_id or local_id,
            "timestamp": self.timestamp,
            "tier": self.planned.tier,
            "model": model,
            "route": self.route,
            "outcome": self.outcome,
            "status_code": self.status,
            "stream": self.stream,
            "input_tokens": self.prompt_tokens
            if self.prompt_tokens is not None
            else self.planned.input_tokens,
            "output_tokens": tokens,
            # Without server timings (another server, or one without the middleware) the
            # record still needs an e2e: the client's is the only one there is.
            "e2e_s": server.get("e2e_s", _us(self.e2e_s)),
            "client_e2e_s": _us(self.e2e_s),
        }
        for phase in PHASES:
            if f"{phase}_s" in server:
                record[f"{phase}_s"] = server[f"{phase}_s"]
        if "ttft_s" in server:
            record["ttft_s"] = server["ttft_s"]
            if tokens > 1 and "e2e_s" in server:
                record["tpot_s"] = _us(max(0.0, server["e2e_s"] - server["ttft_s"]) / (tokens - 1))
        if self.ttft_s is not None:
            record["client_ttft_s"] = _us(self.ttft_s)
            record["client_itl_s"] = [_us(gap) for gap in self.itl_s]
            if tokens > 1:
                record["client_tpot_s"] = _us(max(0.0, self.e2e_s - self.ttft_s) / (tokens - 1))
        if self.send_lag_s is not None:
            record["client_send_lag_s"] = _us(self.send_lag_s)
        if run is not None:
            record["run"] = run
        return record


def _us(seconds: float) -> float:
    """Microsecond resolution, as the server reports its own: keeps the JSONL small."""
    return round(seconds, 6)


def request_body(planned: PlannedRequest, settings: RequestSettings) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": settings.model,
        "max_tokens": planned.max_tokens,
        "stream": settings.stream,
    }
    if settings.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": planned.prompt}]
    else:
        body["prompt"] = planned.prompt
    if settings.stream:
        body["stream_options"] = {"include_usage": True}
    if settings.ignore_eos:
        body["ignore_eos"] = True  # vLLM, SGLang and our engine: the planned length, exactly
    if settings.seed is not None:
        body["seed"] = settings.seed + planned.index
    return body


async def measure(
    client: Client,
    base_url: str,
    planned: PlannedRequest,
    settings: RequestSettings,
    scheduled: float | None = None,
) -> Measurement:
    """Send one request and time it; `scheduled` (open loop) is the `perf_counter` it was due."""
    route = ROUTES[settings.endpoint]
    headers = {settings.tier_header: planned.tier} if settings.tier_header else {}
    body = request_body(planned, settings)
    result = Measurement(planned, time.time(), route, settings.stream)
    start = time.perf_counter()
    if scheduled is not None:
        result.send_lag_s = max(0.0, start - scheduled)
    try:
        async with client.stream(
            "POST", base_url + route, json=body, headers=headers, timeout=settings.timeout_s
        ) as response:
            result.status = response.status_code
            result.outcome = outcome_for_status(response.status_code)
            result.request_id = response.headers.get("x-request-id")
            if response.status_code >= 400 or not settings.stream:
                payload = await response.aread()
                result.e2e_s = time.perf_counter() - start
                result.server = parse_server_timing(response.headers.get("server-timing"))
                _read_full_body(result, payload)
                return result
            await _read_stream(response, result, start)
    except httpx.TimeoutException as error:
        result.outcome, result.error = "timeout", f"timed out: {error!r}"
    except httpx.HTTPError as error:
        result.outcome, result.error = "server_error", f"{type(error).__name__}: {error}"
    result.e2e_s = time.perf_counter() - start
    return result


async def _read_stream(
    response: httpx.Response | LeanResponse, result: Measurement, start: float
) -> None:
    """Read an SSE stream with the middleware's wire parser (`middleware.wire.reader`): one
    definition of a token event on both sides of the wire."""
    from middleware.wire.reader import WireReader  # the front door imports middleware per command

    reader = WireReader(keep_comments=True)
    last_text_at: float | None = None
    async for piece in response.aiter_bytes():
        now = time.perf_counter()
        events, _ = reader.feed(piece)
        if events:
            result.text_chunks += events
            if last_text_at is None:
                if result.ttft_s is None:
                    result.ttft_s = now - start
                events -= 1
            elif events:
                result.itl_s.append(now - last_text_at)
                events -= 1
            # Events read in one piece arrived together: zero gaps between them.
            result.itl_s.extend([0.0] * events)
            last_text_at = now
        elif reader.finished and result.ttft_s is None:
            result.ttft_s = now - start
    for comment in reader.comments or ():
        timings = parse_timings_comment(comment.decode("utf-8", "replace"))
        if timings is not None:
            result.server = timings
    if reader.error is not None:
        result.outcome = "server_error"
        result.error = json.dumps(reader.error)[:200]
    _take_report(result, reader)


def _read_full_body(result: Measurement, payload: bytes) -> None:
    from middleware.wire.reader import WireReader

    reader = WireReader()
    reader.read_body(payload)
    _take_report(result, reader)
    if result.status >= 400 and isinstance(reader.error, dict):
        result.error = str(reader.error.get("message", ""))[:200]


def _take_report(result: Measurement, reader: WireReader) -> None:
    report = reader.report
    if report.input_tokens is not None:
        result.prompt_tokens = report.input_tokens
    if report.output_tokens is not None:
        result.completion_tokens = report.output_tokens
