"""The OpenTelemetry GenAI metrics we emit, in one place: each instrument's name, kind, unit,
bucket boundaries and attributes, and the names the OpenTelemetry-to-Prometheus rules give
them on `/metrics` (`gen_ai_server_time_to_first_token_seconds`, labels such as
`gen_ai_operation_name`).

The middleware (`middleware.otel`) creates its instruments from these entries; the dashboards
read their Prometheus names and labels from here, as they read the `llm_slo_*` names from the
SLI catalog (`slo.sli`).

Source: `open-telemetry/semantic-conventions-genai` at CONVENTIONS_COMMIT (the repository has
no tagged release; its manifest's schema URL is SCHEMA_URL). The metric model is
`model/gen-ai/metrics.yaml` and `model/gen-ai/token-metrics.yaml`; the explicit bucket
boundaries live in the prose of `docs/gen-ai/gen-ai-metrics.md` and
`docs/gen-ai/gen-ai-token-metrics.md` ("This metric SHOULD be specified with
ExplicitBucketBoundaries of ..."); `slo.buckets` keeps them, as the base of the catalog's own.
At that commit the conventions define no server-side token metric: a model server reports
token usage with the inference token instruments (`gen_ai.client.inference.*`), which
replaced `gen_ai.client.token.usage`.

tests/conventions/ keeps a copy of the entries, written from the repository by hand, and the
conformance test checks what we emit against that copy, not against this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from slo.buckets import (
    OTEL_DURATION_BUCKETS,
    OTEL_TOKEN_BUCKETS,
    OTEL_TPOT_BUCKETS,
    OTEL_TTFT_BUCKETS,
)

CONVENTIONS_REPOSITORY = "open-telemetry/semantic-conventions-genai"
CONVENTIONS_COMMIT = "066d4a7f356f8600de6f10c42874626ab88692fb"
SCHEMA_URL = "https://opentelemetry.io/schemas/gen-ai-dev/1.42.0-dev"

# The attribute keys the metrics carry (registry names); the span carries them too.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
TOKEN_MODALITY = "gen_ai.token.modality"
ERROR_TYPE = "error.type"

# What we set of `metric_attributes.gen_ai` (common attributes, response model, provider), in
# the order they become Prometheus labels. Its `server.address` (recommended) and `server.port`
# (required only with an address) are left off: a server's own address is one value shared by
# every series of a replica, which the Prometheus target and the OTLP resource already carry.
METRIC_ATTRIBUTES = (OPERATION, PROVIDER, REQUEST_MODEL, RESPONSE_MODEL)

# The model label of a model nobody listed (metrics only; spans carry the name as asked).
OTHER_MODEL = "other"

DURATION_BOUNDARIES = OTEL_DURATION_BUCKETS
TTFT_BOUNDARIES = OTEL_TTFT_BUCKETS
TPOT_BOUNDARIES = OTEL_TPOT_BUCKETS
TOKEN_BOUNDARIES = OTEL_TOKEN_BUCKETS

# OpenTelemetry-to-Prometheus translation (the specification's Prometheus compatibility rules,
# as opentelemetry-exporter-prometheus applies them): invalid characters become `_`, the unit
# becomes a suffix (curly-brace annotations such as `{token}` are dropped), counters end in
# `_total`.
_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_label(key: str) -> str:
    """`gen_ai.operation.name` -> `gen_ai_operation_name`."""
    return _INVALID.sub("_", key)


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """`gen_ai.server.time_to_first_token`, `s`, histogram ->
    `gen_ai_server_time_to_first_token_seconds`."""
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(re.sub(r"\{[^}]*\}", "", unit), "")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return base


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
    # The SLI catalog entry whose `llm_slo_*` series measures the same thing (its buckets sit
    # on the spec's thresholds, these on the conventions' fixed boundaries): the dashboards
    # and docs point from one to the other.
    counterpart: str | None = None

    @property
    def prometheus_name(self) -> str:
        """The family name on `/metrics` (a counter's ends in `_total`)."""
        return prometheus_name(self.name, self.unit, self.kind)

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return tuple(prometheus_label(key) for key in self.attributes)

    @property
    def prometheus_series(self) -> tuple[str, ...]:
        """Every sample name the family writes: `_bucket`, `_sum`, `_count` of a histogram."""
        if self.kind == "histogram":
            return tuple(self.prometheus_name + end for end in ("_bucket", "_sum", "_count"))
        return (self.prometheus_name,)


REQUEST_DURATION = Instrument(
    "gen_ai.server.request.duration",
    "histogram",
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    DURATION_BOUNDARIES,
    counterpart="e2e",
)
TIME_TO_FIRST_TOKEN = Instrument(
    "gen_ai.server.time_to_first_token",
    "histogram",
    "s",
    "Time to generate first token for successful responses.",
    METRIC_ATTRIBUTES,
    TTFT_BOUNDARIES,
    records="ok",
    counterpart="ttft",
)
TIME_PER_OUTPUT_TOKEN = Instrument(
    "gen_ai.server.time_per_output_token",
    "histogram",
    "s",
    "Time per output token generated after the first token for successful responses.",
    METRIC_ATTRIBUTES,
    TPOT_BOUNDARIES,
    records="ok",
    counterpart="tpot",
)
OPERATION_INPUT_TOKENS = Instrument(
    "gen_ai.client.inference.operation.input_tokens",
    "histogram",
    "{token}",
    "The number of input (prompt) tokens used per inference operation.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    TOKEN_BOUNDARIES,
    counterpart="input_tokens",
)
OPERATION_OUTPUT_TOKENS = Instrument(
    "gen_ai.client.inference.operation.output_tokens",
    "histogram",
    "{token}",
    "The number of output (completion) tokens used per inference operation.",
    (*METRIC_ATTRIBUTES, ERROR_TYPE),
    TOKEN_BOUNDARIES,
    counterpart="output_tokens",
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
    counterpart="throughput",
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
