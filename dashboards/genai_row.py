"""The OpenTelemetry GenAI row: the `gen_ai_*` series the middleware exports when
OpenTelemetry is on, by operation and requested model, with a note on which series to use
for what (they sit beside the `llm_slo_*` series, they do not replace them).

Every name, unit and label comes from `slo.genai`, and each panel points to the catalog
series (`slo.sli`) that measures the same thing on buckets cut at the spec's thresholds.
"""

from __future__ import annotations

from dashboards.model import Panel, Row, Target
from dashboards.queries import QUANTILES, percentile_legend, summed_rate
from slo import genai
from slo.promql import matcher
from slo.sli import CATALOG

TITLE = "OpenTelemetry GenAI (gen_ai_*)"
# Grouped by operation and requested model: the labels a reader splits a fleet by. The
# provider and response model usually follow from these; error_type is summed over.
GROUP: tuple[str, ...] = tuple(
    genai.prometheus_label(key) for key in (genai.OPERATION, genai.REQUEST_MODEL)
)
_LEGEND = " ".join(f"{{{{{label}}}}}" for label in GROUP)
# The series have no tier and carry the model the request named, not the configured `model`
# label: of the dashboard's variables only the instance filters them.
_INSTANCE = matcher("instance", "=~", "$instance")


def _grafana_unit(instrument: genai.Instrument) -> str:
    """Grafana's unit for an instrument's UCUM unit: seconds, or a plain count for the
    curly-brace annotations (`{token}`)."""
    if instrument.unit == "s":
        return "s"
    if instrument.unit.startswith("{") and instrument.unit.endswith("}"):
        return "none"
    raise ValueError(
        f"dashboards/genai_row.py: no Grafana unit for {instrument.name} (unit "
        f"{instrument.unit!r}); add it to _grafana_unit"
    )


def _which_requests(instrument: genai.Instrument) -> str:
    if instrument.records == "ok":
        return "successful responses"
    error_label = genai.prometheus_label(genai.ERROR_TYPE)
    return f"every request, failed ones too, whose series carry `{error_label}`"


def _counterpart(instrument: genai.Instrument) -> str:
    """`llm_slo_time_to_first_token_seconds` (catalog `ttft`)."""
    if instrument.counterpart is None:
        return "none"
    return f"`{CATALOG[instrument.counterpart].metric}` (catalog `{instrument.counterpart}`)"


def _percentile_panel(title: str, instrument: genai.Instrument) -> Panel:
    bucket = instrument.prometheus_name + "_bucket"
    grouping = ", ".join((*GROUP, "le"))
    targets = [
        Target(
            f"histogram_quantile({q}, {summed_rate(bucket, grouping, _INSTANCE)})",
            percentile_legend(_LEGEND, q),
        )
        for q in QUANTILES
    ]
    description = (
        f"p50, p95 and p99 of `{instrument.name}` ({_which_requests(instrument)}) by "
        f"operation and requested model, interpolated inside the conventions' fixed buckets. "
        f"For the SLO read {_counterpart(instrument)}: its buckets sit on the spec's thresholds."
    )
    return Panel(title, description, _grafana_unit(instrument), targets)


def _token_usage_panel() -> Panel:
    counters = (genai.USAGE_INPUT_TOKENS, genai.USAGE_OUTPUT_TOKENS)
    targets = [
        Target(
            summed_rate(counter.prometheus_name, ", ".join(GROUP), _INSTANCE),
            f"{_LEGEND} {counter.name.rsplit('.', 1)[1].replace('_', ' ')}/s",
        )
        for counter in counters
    ]
    names = " and ".join(f"`{counter.name}`" for counter in counters)
    description = (
        f"Tokens per second from {names}, by operation and requested model. The output "
        f"tokens' series for the SLO rows is {_counterpart(genai.USAGE_OUTPUT_TOKENS)}."
    )
    return Panel(
        "Token usage rate by operation and model",
        description,
        _grafana_unit(genai.USAGE_INPUT_TOKENS),
        targets,
    )


def _notes() -> list[str]:
    commit = genai.CONVENTIONS_COMMIT[:8]
    table = [
        "| OpenTelemetry metric | on /metrics (the conventions' buckets) | for SLOs and alerts "
        "(buckets on the thresholds) |",
        "|---|---|---|",
        *(f"| `{i.name}` | `{i.prometheus_name}` | {_counterpart(i)} |" for i in genai.INSTRUMENTS),
    ]
    return [
        "**Which series to use for what.** This row reads the OpenTelemetry GenAI metrics "
        f"(`{genai.CONVENTIONS_REPOSITORY}` at `{commit}`) under the names the "
        "OpenTelemetry-to-Prometheus rules give them. Their bucket boundaries are the "
        "conventions' fixed ones, the same on every instrumented server: use them for a "
        "fleet-wide or cross-vendor view. SLOs, burn rates and alerts use the `llm_slo_*` "
        "series of the rows above: their bucket edges sit on every threshold of the spec, so "
        "each threshold is counted exactly, per tier, where a percentile here is interpolated "
        "inside fixed buckets.",
        "\n".join(table),
        "These series exist only when OpenTelemetry is on (docs/opentelemetry.md, "
        '"Exporting"). They have no tier, and their model is the one the request named '
        f"(`{genai.OTHER_MODEL}` for a model nobody listed), so the tier and model variables "
        "do not apply to them; the instance variable does.",
    ]


def genai_row() -> Row:
    return Row(
        TITLE,
        [
            _percentile_panel(
                "Time to first token by operation and model", genai.TIME_TO_FIRST_TOKEN
            ),
            _percentile_panel("Request duration by operation and model", genai.REQUEST_DURATION),
            _percentile_panel(
                "Time per output token by operation and model", genai.TIME_PER_OUTPUT_TOKEN
            ),
            _token_usage_panel(),
        ],
        optional=True,
        notes=_notes(),
    )
