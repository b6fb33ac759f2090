"""A test engine behind SGLang's released tracing code (the pinned wheel, loaded by
`tests.helpers.sglang_release`), for `uvicorn --factory tests.helpers.sglang_engine:create_app`.

It has real queueing: a scheduler loop with a fixed number of slots, continuous batching, a
waiting queue the requests leave in order. Its forward passes are sleeps (no GPU here); every
stage boundary calls SGLang's own code as its tokenizer manager and scheduler do
(sglang/srt/managers/tokenizer_manager.py, scheduler.py, schedule_batch.py,
scheduler_components/batch_result_processor.py):

- tokenizer manager: `APIServerReqTimeStats.init_trace_ctx` with the request's `traceparent`
  (`extract_trace_headers`), `set_created_time` (the root span `" Req <rid[:8]>"`),
  `set_tokenize_finish_time`, `set_api_server_dispatch_time` / `_finish_time`; at the first
  output `set_first_token_time`; at the end `set_finished_time` with its span attributes
  (usage and `gen_ai.request.id`) and `convert_to_gen_ai_span_attrs`;
- scheduler: the stats pickled across (as over ZMQ) into `SchedulerReqTimeStats.new_from_obj`,
  `set_scheduler_recv_time`, `set_wait_queue_entry_time`, per batch `set_schedule_time_batch`,
  `set_forward_entry_time` (the `prefill_waiting` slice), `set_prefill_finished_time`
  (`prefill_forward`), per decode step `set_last_decode_finish_time` (`decode_loop`), and
  `set_completion_time`.

Spans go out through SGLang's `process_tracing_init` (its `get_otlp_span_exporter` and batch
processor) to LLM_SLO_SGLANG_OTLP_URL, over the protocol OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
names (SGLang's default: grpc; or http/protobuf); with LLM_SLO_SGLANG_SPANS_FILE, a second processor
writes every span as a JSON line there (name, trace id, start and end in ns), for the test to
compare with. Environment: SLOTS (2), PREFILL_S, DECODE_S (per step), TOKENS (per answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.helpers.sglang_release import load

ENV = "LLM_SLO_SGLANG_"


@dataclass
class Req:
    rid: str
    prompt_tokens: int
    max_tokens: int
    time_stats: Any  # SchedulerReqTimeStats, under Req's own name
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    generated: int = 0


@dataclass
class Batch:
    """What `set_schedule_time_batch` reads of a ScheduleBatch."""

    reqs: list[Req]
    forward_mode: Any


class Scheduler:
    """Continuous batching over `slots`: admitted requests prefill together, then decode one
    token per step together; a finished one frees its slot for the next in the queue."""

    def __init__(self, stats: ModuleType, forward_mode: Any, config: Mapping[str, float]):
        self.stats, self.mode = stats, forward_mode
        self.slots = int(config["slots"])
        self.prefill_s, self.decode_s = config["prefill_s"], config["decode_s"]
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.wake = asyncio.Event()

    def add(self, req: Req) -> None:
        req.time_stats.set_wait_queue_entry_time()
        self.waiting.append(req)
        self.wake.set()

    async def run(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self.wake.clear()
                await self.wake.wait()
            free = self.slots - len(self.running)
            if self.waiting and free > 0:
                admitted = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
                await self._prefill(admitted)
                self.running.extend(admitted)
            else:
                await self._decode()

    async def _prefill(self, reqs: list[Req]) -> None:
        self.stats.set_schedule_time_batch(Batch(reqs, self.mode.EXTEND))
        self.stats.set_time_batch(reqs, "set_forward_entry_time")
        await asyncio.sleep(self.prefill_s)
        self.stats.set_time_batch(reqs, "set_prefill_finished_time")
        for req in reqs:
            self._emit(req)

    async def _decode(self) -> None:
        self.stats.set_schedule_time_batch(Batch(self.running, self.mode.DECODE))
        await asyncio.sleep(self.decode_s)
        self.stats.set_time_batch(self.running, "set_last_decode_finish_time")
        for req in list(self.running):
            self._emit(req)

    def _emit(self, req: Req) -> None:
        req.generated += 1
        req.out.put_nowait(f"t{req.generated} ")
        if req.generated >= req.max_tokens:
            req.time_stats.set_completion_time()
            if req in self.running:
                self.running.remove(req)
            req.out.put_nowait(None)


class SpansFile:
    """A second span exporter: each span as one JSON line (the engine's own times)."""

    def __init__(self, path: str) -> None:
        self.path, self.lock = path, threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [
            json.dumps(
                {
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "start_ns": span.start_time,
                    "end_ns": span.end_time,
                }
            )
            for span in spans
        ]
        with self.lock, open(self.path, "a") as out:
            out.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _start_tracing(trace: ModuleType, env: Mapping[str, str]) -> None:
    trace.process_tracing_init(env[ENV + "OTLP_URL"], "sglang")
    trace.trace_set_thread_info("Tokenizer")
    spans_file = env.get(ENV + "SPANS_FILE")
    if spans_file:
        from opentelemetry import trace as otel_trace
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider: Any = otel_trace.get_tracer_provider()
        provider.add_span_processor(SimpleSpanProcessor(SpansFile(spans_file)))  # type: ignore[arg-type]


class Engine:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.trace, self.stats = load()
        _start_tracing(self.trace, env)
        forward_mode = self.stats.ForwardMode
        config = {
            "slots": float(env.get(ENV + "SLOTS", "2")),
            "prefill_s": float(env.get(ENV + "PREFILL_S", "0.03")),
            "decode_s": float(env.get(ENV + "DECODE_S", "0.01")),
        }
        self.tokens = int(env.get(ENV + "TOKENS", "6"))
        self.scheduler = Scheduler(self.stats, forward_mode, config)

    def admit(self, request: Request, body: dict[str, Any]) -> tuple[Any, Req]:
        """The tokenizer manager's part, then the scheduler's receipt of the request."""
        rid = uuid.uuid4().hex
        api = self.stats.APIServerReqTimeStats()
        headers = self.trace.extract_trace_headers(dict(request.headers))
        api.init_trace_ctx(rid, None, headers)
        api.set_created_time()
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        prompt_tokens = max(len(prompt.split()), 1)
        api.set_tokenize_finish_time()
        api.set_api_server_dispatch_time()
        sent = pickle.dumps(api)  # to the scheduler, as over ZMQ
        api.set_api_server_dispatch_finish_time()
        scheduler_stats = self.stats.SchedulerReqTimeStats.new_from_obj(pickle.loads(sent))
        scheduler_stats.set_scheduler_recv_time()
        max_tokens = int(body.get("max_tokens") or self.tokens)
        return api, Req(rid, prompt_tokens, max_tokens, scheduler_stats)

    def finish(self, api: Any, req: Req) -> None:
        s = self.trace.SpanAttributes
        attrs = {
            s.GEN_AI_USAGE_COMPLETION_TOKENS: req.generated,
            s.GEN_AI_USAGE_PROMPT_TOKENS: req.prompt_tokens,
            s.GEN_AI_USAGE_CACHED_TOKENS: 0,
            s.GEN_AI_REQUEST_ID: req.rid,
            s.GEN_AI_REQUEST_MAX_TOKENS: req.max_tokens,
        }
        api.set_finished_time(span_attrs=attrs)


def _chunk(rid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time())}
    body.update(model="sglang-test", choices=[choice])
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _stream(engine: Engine, api: Any, req: Req) -> AsyncIterator[bytes]:
    """SGLang's chat stream (entrypoints/openai/serving_chat.py): role chunk, content chunks,
    a finish chunk, the usage chunk, `[DONE]`."""
    first = True
    while (text := await req.out.get()) is not None:
        if first:
            api.set_first_token_time()
            yield _chunk(req.rid, {"role": "assistant", "content": ""})
            first = False
        yield _chunk(req.rid, {"content": text})
    engine.finish(api, req)
    yield _chunk(req.rid, {}, "length")
    usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated}
    usage["total_tokens"] = req.prompt_tokens + req.generated
    body = {"id": req.rid, "object": "chat.completion.chunk", "choices": [], "usage": usage}
    yield b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def _report_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        raise SystemExit(f"the scheduler stopped: {task.exception()!r}")


def create_app(env: Mapping[str, str] | None = None) -> Starlette:
    env = dict(os.environ if env is None else env)
    engine = Engine(env)

    async def chat(request: Request) -> Response:
        body = await request.json()
        api, req = engine.admit(request, body)
        engine.scheduler.add(req)
        return StreamingResponse(_stream(engine, api, req), media_type="text/event-stream")

    async def health(_request: Request) -> Response:
        return Response("ok")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(engine.scheduler.run())
        task.add_done_callback(_report_failure)
        yield
        task.cancel()
        from opentelemetry import trace as otel_trace

        otel_trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes, lifespan=lifespan)
