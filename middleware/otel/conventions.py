"""The OpenTelemetry GenAI semantic conventions we speak, in one place: names, units, bucket
boundaries and attribute keys of the request span and the `gen_ai.*` metrics.

Source: `open-telemetry/semantic-conventions-genai` at CONVENTIONS_COMMIT (the repository has
no tagged release; its manifest's schema URL is SCHEMA_URL). The metric model is
`model/gen-ai/metrics.yaml` and `model/gen-ai/token-metrics.yaml`; the explicit bucket
boundaries live in the prose of `docs/gen-ai/gen-ai-metrics.md` and
`docs/gen-ai/gen-ai-token-metrics.md` ("This metric SHOULD be specified with
ExplicitBucketBoundaries of ..."). At that commit the conventions define no server-side token
metric: a model server reports token usage with the inference token instruments
(`gen_ai.client.inference.*`), which replaced `gen_ai.client.token.usage`.

tests/conventions/ keeps a copy of the entries, written from the repository by hand, and the
conformance test checks what we emit against that copy, not against this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

CONVENTIONS_REPOSITORY = "open-telemetry/semantic-conventions-genai"
CONVENTIONS_COMMIT = "066d4a7f356f8600de6f10c42874626ab88692fb"
SCHEMA_URL = "https://opentelemetry.io/schemas/gen-ai-dev/1.42.0-dev"

# Attribute keys (registry names).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
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
TOKEN_MODALITY = "gen_ai.token.modality"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# Well-known `gen_ai.operation.name` values of the OpenAI routes we measure.
CHAT = "chat"
TEXT_COMPLETION = "text_completion"

# What we set of `metric_attributes.gen_ai` (common attributes, response model, provider), in
# the order they become Prometheus labels. Its `server.address` (recommended) and `server.port`
# (required only with an address) are left off: a server's own address is one value shared by
# every series of a replica, which the Prometheus target and the OTLP resource already carry.
METRIC_ATTRIBUTES = (OPERATION, PROVIDER, REQUEST_MODEL, RESPONSE_MODEL)

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

# The model label of a model nobody listed (metrics only; spans carry the name as asked).
OTHER_MODEL = "other"

# fmt: off
DURATION_BOUNDARIES = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
TTFT_BOUNDARIES = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
TPOT_BOUNDARIES = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BOUNDARIES = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
# fmt: on


@dataclass(frozen=True)
class Instrument:
    """One convention metric: what the SDK instrument is created with, which attributes we set
    on it (in label order) and which requests it records."""

    name: str
    kind: Literal["histogram", "counter"]
    unit: str
    description: str
    attributes: tuple[str, ...]
    boundaries: tuple[float, ...] = ()
    # "ok": successful responses only (the conventions' "for successful responses");
    # "all": every request, failed ones too (with error.type where the instrument has it).
    records: Literal["ok", "all"] = "all"

    @property
    def prometheus_name(self) -> str:
        return prometheus_name(self.name, self.unit, self.kind)


REQUEST_DURATION = Instrument(
    "gen_ai.server.request.duration",
    "histogram",
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    DURATION_BOUNDARIES,
)
TIME_TO_FIRST_TOKEN = Instrument(
    "gen_ai.server.time_to_first_token",
    "histogram",
    "s",
    "Time to generate first token for successful responses.",
    METRIC_ATTRIBUTES,
    TTFT_BOUNDARIES,
    records="ok",
)
TIME_PER_OUTPUT_TOKEN = Instrument(
    "gen_ai.server.time_per_output_token",
    "histogram",
    "s",
    "Time per output token generated after the first token for successful responses.",
    METRIC_ATTRIBUTES,
    TPOT_BOUNDARIES,
    records="ok",
)
OPERATION_INPUT_TOKENS = Instrument(
    "gen_ai.client.inference.operation.input_tokens",
    "histogram",
    "{token}",
    "The number of input (prompt) tokens used per inference operation.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    TOKEN_BOUNDARIES,
)
OPERATION_OUTPUT_TOKENS = Instrument(
    "gen_ai.client.inference.operation.output_tokens",
    "histogram",
    "{token}",
    "The number of output (completion) tokens used per inference operation.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    TOKEN_BOUNDARIES,
)
USAGE_INPUT_TOKENS = Instrument(
    "gen_ai.client.inference.usage.input_tokens",
    "counter",
    "{token}",
    "The number of input (prompt) tokens used, including cached tokens.",
    (*METRIC_ATTRIBUTES, TOKEN_MODALITY),
)
USAGE_OUTPUT_TOKENS = Instrument(
    "gen_ai.client.inference.usage.output_tokens",
    "counter",
    "{token}",
    "The number of output (completion) tokens used, including reasoning tokens.",
    (*METRIC_ATTRIBUTES, TOKEN_MODALITY),
)
INSTRUMENTS = (
    REQUEST_DURATION,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    OPERATION_INPUT_TOKENS,
    OPERATION_OUTPUT_TOKENS,
    USAGE_INPUT_TOKENS,
    USAGE_OUTPUT_TOKENS,
)

# OpenTelemetry-to-Prometheus translation (the specification's Prometheus compatibility rules,
# as opentelemetry-exporter-prometheus applies them): invalid characters become `_`, the unit
# becomes a suffix (curly-brace annotations such as `{token}` are dropped), counters end in
# `_total`.
_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_label(key: str) -> str:
    return _INVALID.sub("_", key)


def prometheus_name(name: str, unit: str, kind: str) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(re.sub(r"\{[^}]*\}", "", unit), "")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return base
