"""vLLM: its OTLP request span and its Prometheus `/metrics` (v1 engine).

Started with `--otlp-traces-endpoint URL` (and `--collect-detailed-traces` for the model
times), vLLM exports one SERVER span per request, named `llm_request`, a child of the
request's W3C `traceparent` (attribute names: vllm/tracing/utils.py `SpanAttributes`; set in
vllm/v1/engine/output_processor.py `do_tracing`, which starts and ends the span when the engine
finishes the request, so it can leave before the response's last byte). Latencies are seconds,
as floats: queue = scheduled - queued, prefill = first token - scheduled, decode = last token -
first token. `gen_ai.request.id` is `chatcmpl-<X-Request-Id>` (chat) or
`cmpl-<X-Request-Id>-0` (completions). It exports over OTLP/HTTP with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf` (gRPC by default). Nothing on its wire tells
a phase: the stream's first chunk (the role) leaves at prefill end, content deltas may hold
several tokens.
"""

from __future__ import annotations

from middleware.upstream.registry import EngineAdapter, register

VLLM = register(
    EngineAdapter(
        name="vllm",
        span_names=frozenset({"llm_request"}),
        span_attributes={
            "request_id": "gen_ai.request.id",
            "queue_s": "gen_ai.latency.time_in_queue",
            "prefill_s": "gen_ai.latency.time_in_model_prefill",
            "decode_s": "gen_ai.latency.time_in_model_decode",
            "input_tokens": "gen_ai.usage.prompt_tokens",
            "output_tokens": "gen_ai.usage.completion_tokens",
        },
        metrics={
            "vllm:num_requests_waiting": "queue_depth",
            "vllm:num_requests_running": "running",
            "vllm:kv_cache_usage_perc": "kv_usage",  # 0..1 ("1 means 100 percent usage")
            "vllm:gpu_cache_usage_perc": "kv_usage",  # its older, deprecated name; same ratio
            "vllm:num_preemptions": "preemptions",
        },
    )
)
