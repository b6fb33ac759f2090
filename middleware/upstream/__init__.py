"""What an upstream engine tells about a request on the wire: exact token counts and phases.

One small adapter per engine, each read from that project's code and documentation:

- `openai_usage`: the `usage` object of OpenAI-compatible responses (every engine that
  reports it, in a plain body or in the last chunk of a stream with
  `stream_options.include_usage`);
- `llamacpp`: the `timings` object of llama.cpp's C++ server (`llama-server`);
- `tgi`: the `x-queue-time` / `x-inference-time` / `x-time-per-token` response headers of
  Hugging Face TGI (non-streamed responses only: a stream's headers leave before any timing);
- `vllm`, `sglang`: their OTLP request spans (`POST /v1/traces`) and `/metrics`;
- anyone else: `middleware.current_timeline().mark(...)` from inside the app.

Every adapter declares what it reads in one `EngineAdapter` (`registry.py`): headers, body
keys, span names and attributes, and its `/metrics` families.

Each adapter fills an `UpstreamReport`; the timeline carves the phases it knows out of the
time before the first token, and the counts replace the chunk count.
"""

from __future__ import annotations

from middleware.upstream import sglang, vllm
from middleware.upstream.llamacpp import apply_timings
from middleware.upstream.openai_usage import apply_usage
from middleware.upstream.registry import (
    ADAPTERS,
    EngineAdapter,
    SpanPhases,
    adapter_for_span,
    register,
    response_headers,
)
from middleware.upstream.report import UpstreamReport
from middleware.upstream.tgi import apply_tgi_headers

__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "SpanPhases",
    "UpstreamReport",
    "adapter_for_span",
    "apply_tgi_headers",
    "apply_timings",
    "apply_usage",
    "register",
    "response_headers",
    "sglang",
    "vllm",
]
