"""SGLang: its OTLP request spans and its Prometheus `/metrics`.

SGLang's request tracing shares vLLM's `gen_ai.latency.*` attribute names.
"""

from __future__ import annotations

from middleware.upstream.registry import EngineAdapter, register

SGLANG = register(
    EngineAdapter(
        name="sglang",
        span_names=frozenset({"sglang_request"}),
        span_attributes={
            "request_id": "gen_ai.request.id",
            "queue_s": "gen_ai.latency.time_in_queue",
            "prefill_s": "gen_ai.latency.time_in_model_prefill",
            "decode_s": "gen_ai.latency.time_in_model_decode",
            "input_tokens": "gen_ai.usage.prompt_tokens",
            "output_tokens": "gen_ai.usage.completion_tokens",
        },
        metrics={
            "sglang:num_queue_reqs": "queue_depth",
            "sglang:num_running_reqs": "running",
            "sglang:token_usage": "kv_usage",  # KV-cache tokens in use, 0..1
            # Its preemptions: decode requests retracted when the KV cache runs out (the
            # counter `sglang:num_retracted_requests_total`).
            "sglang:num_retracted_requests": "preemptions",
        },
    )
)
