"""SGLang: its OTLP request spans and its Prometheus `/metrics`.

With `--enable-trace --otlp-traces-endpoint`, SGLang makes one root span per request, named
after its role and the request id's first 8 characters (`" Req 1a2b3c4d"` on a unified server,
`"prefill Req ..."` / `"decode Req ..."` when disaggregated), a child of the request's
`traceparent`, and sets vLLM's `gen_ai.latency.*` names on it when the request finishes
(python/sglang/srt/observability/trace.py, `convert_to_gen_ai_span_attrs`): decode = finish -
first token, but its `time_in_model_prefill` runs from the dispatch to the scheduler, so it
holds the queue wait too, and `time_in_queue` is defined but not set. So the root span gives
decode and the counts, and the time before the first token stays `queue_prefill` (its stage
spans `prefill_waiting` / `prefill_forward` would split it; they are not read yet). Its request
id is its own `rid` (it ignores X-Request-Id): joined by trace id.
"""

from __future__ import annotations

import re

from middleware.upstream.registry import EngineAdapter, register

SGLANG = register(
    EngineAdapter(
        name="sglang",
        span_name_pattern=re.compile(r"(?:prefill |decode )? ?Req [0-9A-Za-z_-]{1,8}"),
        span_attributes={
            "request_id": "gen_ai.request.id",
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
