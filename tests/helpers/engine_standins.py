"""Stand-ins for the GPU engines (vLLM, SGLang, TGI) that tests cannot run here, for
`uvicorn --factory tests.helpers.engine_standins:create_app`, configured by environment.

Each serves `/v1/chat/completions` and `/v1/completions` (streamed and plain) on a scripted,
deterministic schedule, `/metrics` with the engine's own names, and exports one request span
per request through the real OpenTelemetry SDK and OTLP/HTTP exporter, named and shaped as
the engine does. The releases they copy: SGLang 0.5.23 (the wheel pinned in
tests/helpers/engine_releases.py; tests of SGLang's tracing run its released code instead,
tests/helpers/sglang_engine.py, and tests/unit/middleware/test_sglang_release.py checks the
names below against the wheel), TGI's router at commit db931fc (2026-01-08), vLLM's v1 engine
as of the same date (its release not pinned here yet).

vLLM (v1): vllm/v1/engine/output_processor.py `do_tracing` ends ONE span `llm_request`, kind
SERVER, start = arrival, end = when the engine finishes (often before the last HTTP byte),
parent = `TraceContextTextMapPropagator().extract()` of the request's `traceparent` and
`tracestate` (vllm/tracing/otel.py `extract_trace_context`). Attributes (vllm/tracing/utils.py
`SpanAttributes`, seconds as floats): gen_ai.latency.{time_to_first_token, e2e, time_in_queue,
time_in_model_prefill, time_in_model_decode, time_in_model_inference}, gen_ai.usage.
{prompt_tokens, completion_tokens}, gen_ai.request.id, gen_ai.response.finish_reasons (a JSON
list in a string), and when set gen_ai.request.{top_p, max_tokens, temperature, n}.
`gen_ai.response.model` is defined there but not set. gen_ai.request.id is the external id:
`chatcmpl-<X-Request-Id>` for chat, `cmpl-<X-Request-Id>-0` for completions (whose body id is
`cmpl-<X-Request-Id>`) (entrypoints/openai/engine/serving.py `_base_request_id`,
chat_completion/serving.py, v1/engine/input_processor.py). Exporter protocol from
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc (default) or http/protobuf, no JSON. Stream: role
chunk `{"role":"assistant","content":""}` at the first output (after prefill), content deltas
(several tokens when busy), finish_reason on the last content chunk, a `choices: []` usage
chunk with stream_options.include_usage, `[DONE]`. /metrics (v1/metrics/loggers.py), labels
model_name, engine: vllm:num_requests_running, vllm:num_requests_waiting,
vllm:kv_cache_usage_perc, vllm:num_preemptions(_total), vllm:prompt_tokens(_total),
vllm:generation_tokens(_total), vllm:request_success(_total){finished_reason}, histograms
vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
vllm:e2e_request_latency_seconds, vllm:request_{queue,prefill,decode,inference}_time_seconds.

SGLang: python/sglang/srt/observability/trace.py `TraceReqContext.trace_req_start`: root span
`f"{role} Req {rid[:8]}"` (role "" when unified, so " Req 1a2b3c4d"), kind INTERNAL (unset),
parent = the extracted `traceparent`; children: a thread span per process and stage slices
(prefill_waiting, prefill_forward, decode_loop, ...; observability/req_time_stats.py).
Root attributes: rid, module; at finish (tokenizer manager span attrs and
`APIServerReqTimeStats.convert_to_gen_ai_span_attrs`) gen_ai.usage.{completion_tokens,
prompt_tokens, cached_tokens}, gen_ai.request.id (= rid, from the body's `rid` or a uuid4 hex;
X-Request-Id is not read), gen_ai.response.model, gen_ai.response.finish_reasons,
gen_ai.latency.{time_to_first_token, e2e, time_in_model_decode, time_in_model_inference,
time_in_model_prefill} (prefill from dispatch, so with the queue wait); no time_in_queue.
Stream (entrypoints/openai/serving_chat.py): role chunk, content chunks, a finish chunk, the
usage chunk, `[DONE]`. /metrics (observability/metrics_collector.py): sglang:num_running_reqs,
sglang:num_queue_reqs, sglang:token_usage, sglang:num_used_tokens,
sglang:num_retracted_requests_total, sglang:queue_time_seconds (labels model_name,
engine_type, tp_rank, pp_rank, moe_ep_rank); sglang:prompt_tokens_total,
sglang:generation_tokens_total, sglang:num_requests_total, sglang:time_to_first_token_seconds,
sglang:inter_token_latency_seconds, sglang:e2e_request_latency_seconds (label model_name).

TGI: router/src/server.rs `#[instrument(skip_all, fields(total_time, validation_time,
queue_time, inference_time, time_per_token, seed, ...))]` on `chat_completions`,
`completions`, `generate`, `generate_stream`: span named after the function, kind INTERNAL,
`span.set_parent()` to the `traceparent` parsed in router/src/logging.rs; fields are Rust
`format!("{d:?}")` strings ("250ms", "1.5s"); exported over gRPC only (tonic). No request id.
Stream (router/src/chat.rs): no role chunk; every chunk carries `delta: {"role": "assistant",
"content": <token>}`, the last one the finish_reason, then the usage chunk, `[DONE]`. /metrics:
tgi_queue_size, tgi_batch_current_size, tgi_batch_current_max_tokens, tgi_request_count,
tgi_request_success, tgi_request_{,validation_,queue_,inference_}duration,
tgi_request_mean_time_per_token_duration, tgi_request_generated_tokens (no labels).

Environment (LLM_SLO_STANDIN_*): ENGINE (vllm|sglang|tgi, required), MODEL, QUEUE_S,
PREFILL_S, DECODE_S (per token after the first), TOKENS (when the request sets no max_tokens),
TOKENS_PER_EVENT, EVENTS_PER_WRITE, END_DELAY_S (held before `[DONE]`), KV_CAPACITY_TOKENS,
PREEMPTIONS (counted per request), OTLP_URL (no spans without it), OTLP_ENCODING
(protobuf|json over OTLP/HTTP; grpc: the SDK's gRPC exporter, OTLP_URL http://HOST:PORT,
its metadata from OTEL_EXPORTER_OTLP_TRACES_HEADERS), OTLP_COMPRESSION (none|gzip|deflate),
EXPORT (normal|twice|never|early), EXPORT_DELAY_MAX_S, SEED. Spans carry the scripted times
(see `Timeline`), so tests compare exactly; the sleeps take a little longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Tracer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.helpers import standin_wire as wire
from tests.helpers.standin_metrics import EngineMetrics, engine_metrics
from tests.helpers.standin_telemetry import (
    ENCODINGS,
    EXPORT_MODES,
    Faults,
    RequestFacts,
    Timeline,
    make_tracer,
    parent_context,
    start_request_span,
)

ENGINES = ("vllm", "sglang", "tgi")
PREFIX = "LLM_SLO_STANDIN_"


@dataclass(frozen=True)
class StandinConfig:
    engine: str
    model: str = "standin-model"
    queue_s: float = 0.0
    prefill_s: float = 0.05
    decode_s: float = 0.01
    tokens: int = 8
    tokens_per_event: int = 1
    events_per_write: int = 1
    end_delay_s: float = 0.0
    kv_capacity_tokens: int = 4096
    preemptions: int = 0
    otlp_url: str = ""
    otlp_encoding: str = "protobuf"
    otlp_compression: str = "none"
    export: str = "normal"
    export_delay_max_s: float = 0.0
    seed: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StandinConfig:
        values: dict[str, Any] = {}
        for field in fields(cls):
            name = PREFIX + field.name.upper()
            if name not in env:
                continue
            kind = {"int": int, "float": float}.get(str(field.type), str)
            try:
                values[field.name] = kind(env[name])
            except ValueError:
                raise ValueError(f"{name}={env[name]!r} is not a {kind.__name__}") from None
        if "engine" not in values:
            raise ValueError(f"{PREFIX}ENGINE is not set: set it to one of {', '.join(ENGINES)}")
        config = cls(**values)
        for name, value, allowed in (
            ("ENGINE", config.engine, ENGINES),
            ("EXPORT", config.export, EXPORT_MODES),
            ("OTLP_ENCODING", config.otlp_encoding, ENCODINGS),
            ("OTLP_COMPRESSION", config.otlp_compression, ("none", "gzip", "deflate")),
        ):
            if value not in allowed:
                raise ValueError(f"{PREFIX}{name}={value!r}: use one of {', '.join(allowed)}")
        if min(config.tokens, config.tokens_per_event, config.events_per_write) < 1:
            raise ValueError(f"{PREFIX}TOKENS, TOKENS_PER_EVENT and EVENTS_PER_WRITE must be >= 1")
        return config


class EngineState:
    """The scheduler's state the stand-in reports on `/metrics`."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.metrics: EngineMetrics = engine_metrics(config.engine, config.model)
        self.waiting = self.running = self.kv_tokens = 0
        self.tracer: Tracer | None = None
        self.provider: TracerProvider | None = None
        if config.otlp_url:
            faults = Faults(config.export, config.export_delay_max_s, config.seed)
            self.tracer, self.provider = make_tracer(
                config.engine,
                config.otlp_url,
                config.otlp_encoding,
                config.otlp_compression,
                faults,
            )
        self._publish()

    def change(self, waiting: int = 0, running: int = 0, kv_tokens: int = 0) -> None:
        self.waiting += waiting
        self.running += running
        self.kv_tokens += kv_tokens
        self._publish()

    def _publish(self) -> None:
        self.metrics.set_state(
            self.waiting, self.running, self.kv_tokens, self.config.kv_capacity_tokens
        )


class Exchange:
    """One request through the scripted engine: queue, prefill, decode, finish."""

    def __init__(self, state: EngineState, request: Request, body: dict[str, Any]) -> None:
        config = self.config = state.config
        self.state = state
        self.route = "chat" if request.url.path.endswith("/chat/completions") else "completions"
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        self.finish_reason = "length" if asked else "stop"
        self.timeline = Timeline(
            arrival_ns=time.time_ns(),
            queue_s=config.queue_s,
            prefill_s=config.prefill_s,
            decode_s=config.decode_s,
            prompt_tokens=prompt_tokens(body),
            completion_tokens=int(asked or config.tokens),
        )
        response_id, request_id = request_ids(config.engine, self.route, request, body)
        options = body.get("stream_options") or {}
        self.reply = wire.Reply(
            engine=config.engine,
            route=self.route,
            response_id=response_id,
            model=body.get("model") or config.model,
            created=int(time.time()),
            prompt_tokens=self.timeline.prompt_tokens,
            include_usage=bool(options.get("include_usage")),
        )
        sampling: dict[str, Any] = {
            key: body[key] for key in ("temperature", "top_p", "top_k", "n", "seed") if key in body
        }
        if asked:
            sampling["max_tokens"] = asked
        self.facts = RequestFacts(
            self.route, request_id, self.reply.model, self.finish_reason, sampling
        )
        self.held = (0, 0, 0)  # waiting, running, KV tokens this request holds
        self.span: Span | None = None
        if state.tracer is not None:
            parent = parent_context(config.engine, request.headers)
            self.span = start_request_span(
                state.tracer, config.engine, parent, self.timeline, self.facts
            )

    def hold(self, waiting: int = 0, running: int = 0, kv_tokens: int = 0) -> None:
        """Change the engine's state and remember this request's share of it."""
        self.held = (self.held[0] + waiting, self.held[1] + running, self.held[2] + kv_tokens)
        self.state.change(waiting, running, kv_tokens)

    def release(self) -> None:
        """Give back what this request still holds (all of it when a client leaves early)."""
        self.hold(*(-share for share in self.held))

    async def tokens(self) -> AsyncIterator[tuple[str, bool]]:
        """(text, is_last) per content event, at the scripted times."""
        self.hold(waiting=1)
        await asyncio.sleep(self.config.queue_s)
        self.hold(waiting=-1, running=1, kv_tokens=self.timeline.prompt_tokens)
        self.state.metrics.preempted(self.config.preemptions)
        await asyncio.sleep(self.config.prefill_s)
        total, group = self.timeline.completion_tokens, self.config.tokens_per_event
        made = 0
        while made < total:
            size = 1 if made == 0 else min(group, total - made)  # the first token goes alone
            if made:
                await asyncio.sleep(self.config.decode_s * size)
            text = "".join(f" t{index}" for index in range(made, made + size))
            made += size
            self.hold(kv_tokens=size)
            yield text, made == total

    async def engine_finished(self) -> None:
        """vLLM and SGLang end their span here, before the last bytes; "early" exports it now,
        synchronously, so it lands before the response ends."""
        t = self.timeline
        self.release()
        self.state.metrics.finished(t, self.finish_reason)
        if self.span is not None and (self.config.engine != "tgi" or self.config.export == "early"):
            await asyncio.to_thread(self.span.end, t.at(t.e2e_s))

    def response_finished(self) -> None:
        """TGI's handler span lives as long as its stream."""
        self.release()
        if self.span is not None and self.span.is_recording():
            self.span.end(self.timeline.at(self.timeline.e2e_s))

    async def events(self) -> AsyncIterator[bytes]:
        first = True
        try:
            async for text, last in self.tokens():
                if first:
                    first = False
                    for role_chunk in wire.opening(self.reply):
                        yield wire.sse_event(role_chunk)
                finish = self.finish_reason if last else None
                completion = self.timeline.completion_tokens
                yield wire.sse_event(wire.content(self.reply, text, finish, completion))
            await self.engine_finished()
            closing = wire.closing(self.reply, self.finish_reason, self.timeline.completion_tokens)
            for document in closing[:-1]:
                yield wire.sse_event(document)
            await asyncio.sleep(self.config.end_delay_s)
            yield wire.sse_event(closing[-1])
        finally:
            self.response_finished()

    async def plain(self) -> Response:
        try:
            texts = [text async for text, _last in self.tokens()]
            await self.engine_finished()
        finally:
            self.response_finished()
        t = self.timeline
        document = wire.plain(self.reply, "".join(texts), self.finish_reason, t.completion_tokens)
        headers = {}
        if self.config.engine == "tgi":
            inference_s = t.prefill_s + t.decode_total_s
            headers = wire.tgi_timing_headers(
                t.e2e_s, t.queue_s, inference_s, self.reply, t.completion_tokens
            )
        return JSONResponse(document, headers=headers)


def prompt_tokens(body: dict[str, Any]) -> int:
    """A whitespace count of the prompt: deterministic, and enough for a stand-in."""
    if "messages" in body:
        text = " ".join(str(message.get("content") or "") for message in body["messages"])
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return max(1, len(text.split()))


def request_ids(engine: str, route: str, request: Request, body: dict[str, Any]) -> tuple[str, str]:
    """(the body's `id`, the span's request id) as each engine derives them."""
    if engine == "vllm":
        base = request.headers.get("x-request-id") or body.get("request_id") or uuid.uuid4().hex
        if route == "chat":
            return f"chatcmpl-{base}", f"chatcmpl-{base}"
        return f"cmpl-{base}", f"cmpl-{base}-0"
    if engine == "sglang":
        rid = str(body.get("rid") or uuid.uuid4().hex)
        return rid, rid
    return "", ""


async def in_writes(events: AsyncIterator[bytes], per_write: int) -> AsyncIterator[bytes]:
    """Several SSE events in one body message, as a busy server or a buffering hop sends them."""
    pending: list[bytes] = []
    async for event in events:
        pending.append(event)
        if len(pending) == per_write:
            yield b"".join(pending)
            pending = []
    if pending:
        yield b"".join(pending)


def create_app(env: Mapping[str, str] | None = None) -> Starlette:
    config = StandinConfig.from_env(os.environ if env is None else env)
    state = EngineState(config)

    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        exchange = Exchange(state, request, body)
        if not body.get("stream"):
            return await exchange.plain()
        headers = {"x-accel-buffering": "no"} if config.engine == "tgi" else {}
        return StreamingResponse(
            in_writes(exchange.events(), config.events_per_write),
            media_type="text/event-stream",
            headers=headers,
        )

    async def metrics(_request: Request) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    async def health(_request: Request) -> Response:
        return Response(b"", status_code=200)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        if state.provider is not None:  # late ("EXPORT_DELAY_MAX_S") exports still go out
            await asyncio.to_thread(state.provider.shutdown)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/metrics", metrics),
            Route("/health", health),
        ],
        lifespan=lifespan,
    )
