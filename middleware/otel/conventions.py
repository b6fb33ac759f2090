"""The OpenTelemetry GenAI semantic conventions we speak, in one place: the request span's
attribute keys and the `gen_ai.*` metrics.

The metrics' entries (names, units, bucket boundaries, attributes, Prometheus names) and the
release of the conventions they come from live in the core, `slo.genai`, where the dashboards
read them too; this module re-exports them, so the middleware names every convention fact
through it.

tests/conventions/ keeps a copy of the entries, written from the repository by hand, and the
conformance test checks what we emit against that copy, not against this module.
"""

from __future__ import annotations

from slo.genai import (
    CONVENTIONS_COMMIT,
    CONVENTIONS_REPOSITORY,
    DURATION_BOUNDARIES,
    ERROR_TYPE,
    INSTRUMENTS,
    METRIC_ATTRIBUTES,
    OPERATION,
    OPERATION_INPUT_TOKENS,
    OPERATION_OUTPUT_TOKENS,
    OTHER_MODEL,
    PROVIDER,
    REQUEST_DURATION,
    REQUEST_MODEL,
    RESPONSE_MODEL,
    SCHEMA_URL,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
    TOKEN_BOUNDARIES,
    TOKEN_MODALITY,
    TPOT_BOUNDARIES,
    TTFT_BOUNDARIES,
    USAGE_INPUT_TOKENS,
    USAGE_OUTPUT_TOKENS,
    Instrument,
    prometheus_label,
    prometheus_name,
)

__all__ = [
    "BUNDLED_PROVIDER",
    "CACHE_READ_TOKENS",
    "CHAT",
    "CHOICE_COUNT",
    "CONVENTIONS_COMMIT",
    "CONVENTIONS_REPOSITORY",
    "DURATION_BOUNDARIES",
    "ERROR_TYPE",
    "FALLBACK_PROVIDER",
    "FINISH_REASONS",
    "INPUT_MESSAGES",
    "INPUT_TOKENS",
    "INSTRUMENTS",
    "MAX_TOKENS",
    "METRIC_ATTRIBUTES",
    "OPERATION",
    "OPERATION_INPUT_TOKENS",
    "OPERATION_OUTPUT_TOKENS",
    "OTHER_MODEL",
    "OUTPUT_MESSAGES",
    "OUTPUT_TOKENS",
    "PROVIDER",
    "PROVIDER_BY_OWNER",
    "REQUEST_DURATION",
    "REQUEST_MODEL",
    "RESPONSE_ID",
    "RESPONSE_MODEL",
    "SCHEMA_URL",
    "SEED",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "STREAM",
    "TEMPERATURE",
    "TEXT_COMPLETION",
    "TIME_PER_OUTPUT_TOKEN",
    "TIME_TO_FIRST_CHUNK",
    "TIME_TO_FIRST_TOKEN",
    "TOKEN_BOUNDARIES",
    "TOKEN_MODALITY",
    "TOP_P",
    "TPOT_BOUNDARIES",
    "TTFT_BOUNDARIES",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "Instrument",
    "prometheus_label",
    "prometheus_name",
]

# Attribute keys (registry names) of the request span; those the metrics carry too are above.
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
MAX_TOKENS = "gen_ai.request.max_tokens"
TEMPERATURE = "gen_ai.request.temperature"
TOP_P = "gen_ai.request.top_p"
STREAM = "gen_ai.request.stream"
CHOICE_COUNT = "gen_ai.request.choice.count"
SEED = "gen_ai.request.seed"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# Well-known `gen_ai.operation.name` values of the OpenAI routes we measure.
CHAT = "chat"
TEXT_COMPLETION = "text_completion"

# `gen_ai.provider.name` when nobody says: ours for the bundled engine, the engine's own name
# when `slo proxy` can tell it (its /v1/models `owned_by`), else a custom value naming the wire
# format (the conventions' well-known values are vendors, not self-hosted engines).
BUNDLED_PROVIDER = "llm_slo"
FALLBACK_PROVIDER = "openai_compatible"
PROVIDER_BY_OWNER = {
    "llm-slo": BUNDLED_PROVIDER,
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llama_cpp",
    "tgi": "tgi",
    "openai": "openai",
}
