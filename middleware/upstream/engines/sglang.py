"""SGLang: its OTLP request spans, their stage spans, and its Prometheus `/metrics`.

Read in SGLang 0.5.23 (the wheel the tests pin, tests/helpers/engine_releases.py). With
`--enable-trace --otlp-traces-endpoint`, SGLang makes one root span per request, named after
its role and the request id's first 8 characters (`" Req 1a2b3c4d"` on a unified server,
`"prefill Req ..."` / `"decode Req ..."` when disaggregated), a child of the request's
`traceparent`, and sets vLLM's `gen_ai.latency.*` names on it when the request finishes
(sglang/srt/observability/trace.py, `convert_to_gen_ai_span_attrs` in req_time_stats.py):
decode = finish - first token, but its `time_in_model_prefill` runs from the dispatch to the
scheduler, so it holds the queue wait too, and `time_in_queue` is defined but not set.

Under the root span, in the same trace, each process has a thread span whose children are the
request's stage slices (req_time_stats.py, `RequestStage`): `prefill_waiting` from entering the
waiting queue to the first forward (`set_forward_entry_time`), `prefill_forward` over the whole
prefill (`set_prefill_finished_time`; a chunked prefill's `chunked_prefill` slices lie inside
it, and stand alone only after a retraction), and one `decode_loop` per decode step
(`set_last_decode_finish_time`). Their sums give queue, prefill and decode
(`read_sglang_stages`), joined with the root span by trace id; the root span gives the counts,
and decode when no stage span came. The stage spans end before the root span, so the SDK's
batch processor exports them before it or with it. Its request id is its own `rid` (it
ignores X-Request-Id): joined by trace id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from middleware.upstream.registry import EngineAdapter, register

# RequestStage's stage names (sglang/srt/observability/req_time_stats.py) for the phases.
QUEUE_STAGE = "prefill_waiting"
PREFILL_STAGE = "prefill_forward"
CHUNKED_PREFILL_STAGE = "chunked_prefill"
DECODE_STAGE = "decode_loop"
STAGES = frozenset((QUEUE_STAGE, PREFILL_STAGE, CHUNKED_PREFILL_STAGE, DECODE_STAGE))


def read_sglang_stages(seconds: Mapping[str, float]) -> dict[str, float]:
    """Queue, prefill and decode of one request from its stage spans' seconds, by name."""
    phases: dict[str, float] = {}
    if QUEUE_STAGE in seconds:
        phases["queue_s"] = seconds[QUEUE_STAGE]
    prefill = seconds.get(PREFILL_STAGE, seconds.get(CHUNKED_PREFILL_STAGE))
    if prefill is not None:  # chunks lie inside prefill_forward: counted once
        phases["prefill_s"] = prefill
    if DECODE_STAGE in seconds:
        phases["decode_s"] = seconds[DECODE_STAGE]
    return phases


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
        stage_spans=STAGES,
        read_stages=read_sglang_stages,
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
