"""The engine stand-ins (tests/helpers/engine_standins.py) under a real uvicorn: each engine's
stream shape, its request span through the real OTLP/HTTP exporter (name, kind, parent taken
from the request's traceparent, the scripted latencies), its /metrics names following its live
state, and the export faults (late, twice, never, before the response ends, JSON bodies)."""

from __future__ import annotations

import json
import math
import random
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.engine_standins import create_app
from tests.helpers.polling import wait_until
from tests.helpers.standin_process import OtlpReceiver, ReceivedSpan, otlp_receiver, standin_server
from tests.helpers.standin_telemetry import rust_duration_debug

pytestmark = pytest.mark.integration

# Binary fractions, so the sums the spans carry are exact.
QUEUE_S, PREFILL_S, DECODE_S = 1.0, 0.25, 0.0625
TOKENS, PER_EVENT, PREEMPTIONS = 5, 2, 2
TTFT_S = QUEUE_S + PREFILL_S  # 1.25
DECODE_TOTAL_S = DECODE_S * (TOKENS - 1)  # 0.25
E2E_S = TTFT_S + DECODE_TOTAL_S  # 1.5
CONTENT_EVENTS = 1 + math.ceil((TOKENS - 1) / PER_EVENT)  # the first token goes alone
TEXT = "".join(f" t{index}" for index in range(TOKENS))
SCHEDULE = {"queue_s": QUEUE_S, "prefill_s": PREFILL_S, "decode_s": DECODE_S}

# (waiting, running, KV in use) gauges, as each engine names them.
LIVE_GAUGES = {
    "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    "tgi": ("tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens"),
}


@dataclass
class Sent:
    route: str
    stream: bool
    trace_id: str
    parent_id: str
    request_id: str  # the X-Request-Id header sent
    documents: list[Any]  # SSE data documents ("[DONE]" kept as a string), or the one body
    headers: httpx.Headers
    done_s: float  # time.monotonic() when the last byte was read


def sse_documents(text: str) -> list[Any]:
    events = [event for event in text.split("\n\n") if event.strip()]
    data = [event.removeprefix("data: ") for event in events]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


def send(base_url: str, route: str, stream: bool, include_usage: bool = False) -> Sent:
    trace_id, parent_id, request_id = (
        secrets.token_hex(16),
        secrets.token_hex(8),
        secrets.token_hex(6),
    )
    body: dict[str, Any] = {"model": "standin-model", "max_tokens": TOKENS, "stream": stream}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "three words here"}]
    else:
        body["prompt"] = "three words here"
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "x-request-id": request_id}
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    response = httpx.post(base_url + path, json=body, headers=headers, timeout=30)
    done_s = time.monotonic()
    response.raise_for_status()
    documents = sse_documents(response.text) if stream else [response.json()]
    return Sent(route, stream, trace_id, parent_id, request_id, documents, response.headers, done_s)


def metric_samples(base_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (only,) = samples[name]
    return only[1]


def request_spans(engine: str, receiver: OtlpReceiver) -> list[ReceivedSpan]:
    names = {
        "vllm": lambda name: name == "llm_request",
        "sglang": lambda name: name.startswith(" Req "),
        "tgi": lambda name: name in ("chat_completions", "completions"),
    }
    return receiver.named(names[engine])


def check_stream(engine: str, sent: Sent) -> None:
    docs = sent.documents
    assert docs[-1] == "[DONE]"
    chunks = [doc for doc in docs[:-1] if doc["choices"]]
    texts = [c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or ""
             for c in chunks]  # fmt: skip
    assert "".join(texts) == TEXT
    assert sum(1 for text in texts if text) == CONTENT_EVENTS
    if sent.route == "chat":
        first_delta = chunks[0]["choices"][0]["delta"]
        if engine == "tgi":  # no role chunk: the role rides on every token chunk
            assert first_delta == {"role": "assistant", "content": " t0"}
            assert len(docs) == CONTENT_EVENTS + 2  # + usage chunk, [DONE]
        else:  # the role chunk, sent with the first output
            assert first_delta == {"role": "assistant", "content": ""}
            finish_chunk = 1 if engine == "sglang" else 0
            assert len(docs) == 1 + CONTENT_EVENTS + finish_chunk + 2
        assert docs[-2]["choices"] == [] and docs[-2]["usage"]["completion_tokens"] == TOKENS
    else:
        assert len(docs) == CONTENT_EVENTS + 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def expected_attributes(engine: str, sent: Sent) -> dict[str, Any]:
    if engine == "tgi":  # Rust Duration Debug strings; validation scripted as 0
        return {
            "queue_time": "1s",
            "inference_time": "500ms",
            "total_time": "1.5s",
            "time_per_token": "100ms",
            "validation_time": "0ns",
        }
    body_id = sent.documents[0]["id"]
    common = {
        "gen_ai.latency.time_to_first_token": TTFT_S,
        "gen_ai.latency.e2e": E2E_S,
        "gen_ai.latency.time_in_model_decode": DECODE_TOTAL_S,
        "gen_ai.usage.completion_tokens": TOKENS,
        "gen_ai.response.finish_reasons": '["length"]',
        "gen_ai.request.max_tokens": TOKENS,
    }
    if engine == "sglang":  # prefill counted from dispatch: it holds the queue wait
        return common | {
            "gen_ai.latency.time_in_model_prefill": TTFT_S,
            "gen_ai.latency.time_in_model_inference": E2E_S,
            "gen_ai.request.id": body_id,
            "gen_ai.response.model": "standin-model",
        }
    request_id = (
        f"chatcmpl-{sent.request_id}" if sent.route == "chat" else f"cmpl-{sent.request_id}-0"
    )
    assert body_id == (request_id if sent.route == "chat" else f"cmpl-{sent.request_id}")
    return common | {
        "gen_ai.latency.time_in_queue": QUEUE_S,
        "gen_ai.latency.time_in_model_prefill": PREFILL_S,
        "gen_ai.latency.time_in_model_inference": PREFILL_S + DECODE_TOTAL_S,
        "gen_ai.request.id": request_id,
    }


def check_span(engine: str, sent: Sent, span: ReceivedSpan) -> None:
    assert span.parent_span_id == sent.parent_id
    assert span.kind == (2 if engine == "vllm" else 1)  # SERVER; INTERNAL
    if engine == "sglang":
        assert span.name == " Req " + sent.documents[0]["id"][:8]
        assert "gen_ai.latency.time_in_queue" not in span.attributes
    if engine == "tgi":
        assert span.name == ("chat_completions" if sent.route == "chat" else "completions")
    for key, expected in expected_attributes(engine, sent).items():
        assert span.attributes.get(key) == expected, key
    assert span.end_ns - span.start_ns == round(E2E_S * 1e9)


def watch_live_state(engine: str, base_url: str) -> None:
    """All four requests wait in the queue together, then all run, holding KV cache."""
    waiting, running, kv = LIVE_GAUGES[engine]

    def state() -> tuple[float, float, float]:
        samples = metric_samples(base_url)
        return value(samples, waiting), value(samples, running), value(samples, kv)

    wait_until(lambda: state()[0] == 4, 5, f"{waiting} == 4", interval_s=0.02)
    wait_until(lambda: state()[:2] == (0, 4) and state()[2] > 0, 5, f"{running} == 4")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_stream_span_and_metrics(engine: str, tmp_path: Path) -> None:
    compression = "gzip" if engine == "sglang" else "none"
    with otlp_receiver() as receiver, standin_server(
        engine, tmp_path, otlp_url=receiver.url, otlp_compression=compression,
        tokens_per_event=PER_EVENT, preemptions=PREEMPTIONS, **SCHEDULE,
    ) as base_url:  # fmt: skip
        requests = [("chat", True, True), ("completions", True, False), ("chat", False, False),
                    ("completions", False, False)]  # fmt: skip
        with ThreadPoolExecutor(len(requests)) as pool:
            futures = [pool.submit(send, base_url, *request) for request in requests]
            watch_live_state(engine, base_url)
            sent = [future.result() for future in futures]
        for item in sent[:2]:
            check_stream(engine, item)
        for item in sent[2:]:
            assert item.documents[0]["usage"]["completion_tokens"] == TOKENS
        if engine == "tgi":
            assert sent[2].headers["x-queue-time"] == "1000"
            assert sent[2].headers["x-inference-time"] == "500"
        wait_until(lambda: len(request_spans(engine, receiver)) == 4, 15, "4 request spans")
        spans = {span.trace_id: span for span in request_spans(engine, receiver)}
        for item in sent:
            check_span(engine, item, spans[item.trace_id])
            assert spans[item.trace_id].content_encoding == ("gzip" if engine == "sglang" else "")
        check_metrics(engine, metric_samples(base_url))


def check_metrics(engine: str, samples: dict[str, list[tuple[dict[str, str], float]]]) -> None:
    for gauge in LIVE_GAUGES[engine]:
        assert value(samples, gauge) == 0
    if engine == "vllm":
        assert set(samples["vllm:num_requests_running"][0][0]) == {"model_name", "engine"}
        assert value(samples, "vllm:generation_tokens_total") == 4 * TOKENS
        assert value(samples, "vllm:num_preemptions_total") == 4 * PREEMPTIONS
        assert value(samples, "vllm:time_to_first_token_seconds_sum") == 4 * TTFT_S
        assert value(samples, "vllm:request_queue_time_seconds_count") == 4
        (success,) = samples["vllm:request_success_total"]
        assert success == ({"model_name": "standin-model", "engine": "0",
                            "finished_reason": "length"}, 4)  # fmt: skip
    elif engine == "sglang":
        labels = set(samples["sglang:num_running_reqs"][0][0])
        assert labels == {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
        assert value(samples, "sglang:generation_tokens_total") == 4 * TOKENS
        assert value(samples, "sglang:num_retracted_requests_total") == 4 * PREEMPTIONS
        assert value(samples, "sglang:num_requests_total") == 4
        assert value(samples, "sglang:e2e_request_latency_seconds_sum") == 4 * E2E_S
    else:
        assert samples["tgi_queue_size"][0][0] == {}
        assert value(samples, "tgi_request_count_total") == 4  # written `tgi_request_count`
        assert value(samples, "tgi_request_queue_duration_sum") == 4 * QUEUE_S
        assert value(samples, "tgi_request_generated_tokens_sum") == 4 * TOKENS


def test_several_events_in_one_write(tmp_path: Path) -> None:
    """EVENTS_PER_WRITE=3: the first body message holds the role chunk and two tokens; every
    event still parses (8 of them)."""
    with standin_server("vllm", tmp_path, events_per_write=3, prefill_s=0, decode_s=0.25) as url:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
            reads = [chunk.decode() for chunk in response.iter_raw()]
    assert reads[0].count("data: ") == 3
    documents = sse_documents("".join(reads))
    assert len(documents) == 8 and documents[-1] == "[DONE]"
    assert documents[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_a_client_leaving_early_frees_its_share(tmp_path: Path) -> None:
    """A stream dropped after its first token: running and KV gauges go back to 0."""
    with standin_server("vllm", tmp_path, prefill_s=0, decode_s=0.25, tokens=40) as base_url:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        path = base_url + "/v1/chat/completions"
        with httpx.stream("POST", path, json=body, timeout=30) as response:
            reads = response.iter_raw()  # kept: a dropped iterator closes the response
            next(reads)
            samples = metric_samples(base_url)
            assert value(samples, "vllm:num_requests_running") == 1
            assert value(samples, "vllm:kv_cache_usage_perc") > 0

        def freed() -> bool:
            samples = metric_samples(base_url)
            running = value(samples, "vllm:num_requests_running")
            return running == 0 and value(samples, "vllm:kv_cache_usage_perc") == 0

        wait_until(freed, 10, "the dropped request's share to be given back")


@pytest.mark.parametrize(
    ("engine", "mode"),
    [("vllm", "twice"), ("vllm", "never"), ("vllm", "late"), ("vllm", "early"), ("tgi", "early")],
)
def test_export_faults(engine: str, mode: str, tmp_path: Path) -> None:
    """ "early" exports the span, synchronously, before the response's last bytes: vLLM's
    lands before the client has `[DONE]`; TGI's (which otherwise ends with its stream) lands
    while the end of the stream is held back a second."""
    settings: dict[str, object] = {"export": mode, "prefill_s": 0.0625, "decode_s": 0.0625}
    if engine == "tgi":
        settings["end_delay_s"] = 1.0
    if mode == "late":
        settings |= {"export": "normal", "export_delay_max_s": 1.0, "seed": 7}
    with (
        otlp_receiver() as receiver,
        standin_server(engine, tmp_path, otlp_url=receiver.url, **settings) as base_url,
    ):
        sent = [send(base_url, "chat", True) for _ in range(3)]
        if mode == "never":
            time.sleep(1.5)
            assert request_spans(engine, receiver) == []
            return
        copies = 2 if mode == "twice" else 1
        wait_until(lambda: len(request_spans(engine, receiver)) == 3 * copies, 15, "the spans")
        time.sleep(0.3)  # no further copy comes
        spans = request_spans(engine, receiver)
    assert len(spans) == 3 * copies
    draws = random.Random(7)
    for item in sent:
        mine = [span for span in spans if span.trace_id == item.trace_id]
        assert len(mine) == copies and len({span.span_id for span in mine}) == 1
        if mode == "early":
            assert mine[0].arrived_s < item.done_s - (0.5 if engine == "tgi" else 0.0)
        if mode == "late":  # each export waits its own draw from the seeded generator
            delay_s = draws.uniform(0.0, 1.0)
            assert item.done_s + delay_s - 0.1 <= mine[0].arrived_s <= item.done_s + delay_s + 1


def test_json_export_with_gzip(tmp_path: Path) -> None:
    """OTLP/JSON (ids in hex, int64 as strings, enums as integers), gzip-compressed."""
    with otlp_receiver() as receiver, standin_server(
        "vllm", tmp_path, otlp_url=receiver.url, otlp_encoding="json", otlp_compression="gzip",
        prefill_s=0.0625, decode_s=0.0625,
    ) as base_url:  # fmt: skip
        sent = send(base_url, "chat", False)
        wait_until(lambda: len(request_spans("vllm", receiver)) == 1, 15, "the JSON span")
    (span,) = request_spans("vllm", receiver)
    assert (span.content_type, span.content_encoding) == ("application/json", "gzip")
    assert (span.trace_id, span.parent_span_id, span.kind) == (sent.trace_id, sent.parent_id, 2)
    assert span.attributes["gen_ai.usage.completion_tokens"] == TOKENS
    assert span.attributes["gen_ai.latency.time_in_model_prefill"] == 0.0625


def test_configuration_errors_name_the_variable() -> None:
    with pytest.raises(ValueError, match="LLM_SLO_STANDIN_ENGINE is not set"):
        create_app({})
    with pytest.raises(ValueError, match="LLM_SLO_STANDIN_EXPORT='sometimes': use one of"):
        create_app({"LLM_SLO_STANDIN_ENGINE": "vllm", "LLM_SLO_STANDIN_EXPORT": "sometimes"})
    with pytest.raises(ValueError, match="LLM_SLO_STANDIN_QUEUE_S='soon' is not a float"):
        create_app({"LLM_SLO_STANDIN_ENGINE": "tgi", "LLM_SLO_STANDIN_QUEUE_S": "soon"})


@pytest.mark.parametrize(
    ("nanos", "text"),
    [(0, "0ns"), (999, "999ns"), (12_500, "12.5µs"), (1_000_001, "1.000001ms"),
     (250_000_000, "250ms"), (1_500_000_000, "1.5s"), (2_000_000_000, "2s")],
)  # fmt: skip
def test_tgi_durations_read_as_rust_writes_them(nanos: int, text: str) -> None:
    assert rust_duration_debug(nanos) == text
