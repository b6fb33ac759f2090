"""OpenTelemetry's GenAI semantic conventions, spoken exactly: the request span's name and
`gen_ai.*` attributes, and the `gen_ai.server.*` metrics and token usage through the SDK's
MeterProvider (OTLP when the `OTEL_*` variables say so) and on `/metrics`.

Which release of the conventions, and why each choice: `middleware.otel.conventions` (the
metrics' entries and their Prometheus names: `slo.genai`, where the dashboards read them too).
"""

from middleware.otel.conventions import CONVENTIONS_COMMIT, INSTRUMENTS, SCHEMA_URL
from middleware.otel.metrics import GenAIMetrics
from middleware.otel.models import ModelLabels, fetch_listing, provider_for_owner
from middleware.otel.request import GenAIRequest, RequestBody, read_request_body

__all__ = [
    "CONVENTIONS_COMMIT",
    "INSTRUMENTS",
    "SCHEMA_URL",
    "GenAIMetrics",
    "GenAIRequest",
    "ModelLabels",
    "RequestBody",
    "fetch_listing",
    "provider_for_owner",
    "read_request_body",
]
