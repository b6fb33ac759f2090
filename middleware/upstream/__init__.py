"""What an upstream engine tells about a request on the wire: exact token counts and phases.

One small adapter per engine, each read from that project's code and documentation, in
`middleware/upstream/engines/` (every module there registers at import):

- `llamacpp`: the `timings` object of llama.cpp's C++ server (`llama-server`);
- `tgi`: the `x-queue-time` / `x-inference-time` / `x-time-per-token` response headers of
  Hugging Face TGI (non-streamed responses only: a stream's headers leave before any timing);
- `vllm`, `sglang`: their OTLP request spans (`POST /v1/traces`) and `/metrics`;
- anyone else: `middleware.current_timeline().mark(...)` from inside the app.

`openai_usage` reads the `usage` object of OpenAI-compatible responses (every engine that
reports it, in a plain body or in the last chunk of a stream with
`stream_options.include_usage`): the wire format's own, not one engine's.

Every adapter declares what it reads in one `EngineAdapter` (`registry.py`): headers and the
function that reads them, body keys and the function that reads them, span names and
attributes, and its `/metrics` families.

Each adapter fills an `UpstreamReport`; the timeline carves the phases it knows out of the
time before the first token, and the counts replace the chunk count.
"""

from __future__ import annotations

from middleware.upstream import engines
from middleware.upstream.engines.llamacpp import apply_timings
from middleware.upstream.openai_usage import apply_usage
from middleware.upstream.registry import (
    ADAPTERS,
    EngineAdapter,
    SpanPhases,
    adapter_for_span,
    adapter_for_stage,
    read_response_headers,
    register,
    with_stages,
)
from middleware.upstream.report import UpstreamReport

__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "SpanPhases",
    "UpstreamReport",
    "adapter_for_span",
    "adapter_for_stage",
    "apply_timings",
    "apply_usage",
    "engines",
    "read_response_headers",
    "register",
    "with_stages",
]
