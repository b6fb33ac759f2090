"""`slo compare`: what each serving technique does to TTFT, TPOT, throughput and cost, measured
on one seeded workload and set next to the ranges the industry comparison matrix claims.

This module is the pure half: measurements in, ratio table, text and HTML out. The runs
themselves happen in `engine.workloads.compare` (called from `slo.cli.compare.command`), so
this half never imports the engine or torch. matplotlib, when installed, draws the chart; the
report works without it.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field

from slo.errors import UsageError

Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Claim:
    """One row of the industry comparison matrix: impact as a multiple of the baseline."""

    ttft: Range
    tpot: Range
    throughput: Range
    cost: Range
    quality: str


# The comparison matrix of the reference article ("Comparison Matrix": INT8 quantization,
# continuous batching, speculative decoding, prefix caching; TTFT for prefix caching on hits).
CLAIMS: dict[str, Claim] = {
    "int8": Claim((0.7, 0.8), (0.5, 0.7), (1.5, 2.0), (0.5, 0.7), "minimal (<1%)"),
    "prefix-cache": Claim((0.2, 0.5), (1.0, 1.0), (1.2, 1.5), (0.8, 0.9), "none"),
    "speculative": Claim((1.0, 1.0), (0.3, 0.5), (0.8, 1.0), (1.2, 1.5), "none"),
    "batching": Claim((1.0, 1.2), (0.8, 1.0), (2.0, 4.0), (0.3, 0.5), "none"),
}
# The same article's benchmark rows for the two rates a run reports (p50, world class).
ACCEPTANCE_BENCHMARK = "60-70% typical, >80% world class"
PREFIX_HIT_BENCHMARK = "40-60% typical, >70% world class"

_SYSTEM_PROMPT = (
    "You are a helpful assistant for a small shop. Answer in plain words and keep it short. "
    "Say what you know, say what you do not know, and never make up a price or a date. "
    "When a customer is upset, thank them for their patience before you answer. "
)


def shared_prefix(chars: int) -> str:
    """A system prompt of about `chars` characters that opens every prompt of a run."""
    if chars <= 0:
        return ""
    text = _SYSTEM_PROMPT * (chars // len(_SYSTEM_PROMPT) + 1)
    return text[:chars].rstrip() + "\n\n"


VARIANTS = ("baseline", "int8", "prefix-cache", "speculative", "batching")
DESCRIPTIONS = {
    "baseline": "continuous batching, full precision, no prefix cache, no draft",
    "int8": "INT8 weight-only linear layers (per-channel scales)",
    "prefix-cache": "shared KV blocks for common prompt prefixes",
    "speculative": "draft model proposes tokens, target verifies in one forward",
    "batching": "effect of continuous batching: baseline vs max_batch_size=1",
}


def parse_variants(text: str) -> list[str]:
    variants = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise UsageError(
            f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from "
            f"{','.join(VARIANTS)}"
        )
    if "baseline" not in variants:
        variants.insert(0, "baseline")  # every ratio is to the baseline
    return list(dict.fromkeys(variants))


@dataclass(frozen=True, slots=True)
class Measurement:
    """One variant's run of the workload (engine side fills it; times in seconds)."""

    variant: str
    requests: int
    output_tokens: int
    ttft_p50_s: float
    tpot_p50_s: float
    throughput_tok_s: float
    cpu_s_per_1k_tokens: float
    wall_s: float
    agreement: float | None = None  # share of tokens equal to the baseline's (greedy)
    acceptance_rate: float | None = None  # accepted / proposed draft tokens
    prefix_hit_rate: float | None = None  # prompt tokens found in the prefix cache / looked up
    notes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ImpactRow:
    variant: str
    ttft: float
    tpot: float
    throughput: float
    cost: float
    quality: str
    claim: Claim | None


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


def impact(measurements: list[Measurement]) -> list[ImpactRow]:
    """Ratios to the baseline. For `batching` the run is the baseline with batching *off*
    (max_batch_size=1), so the row inverts it: what turning continuous batching on does."""
    by_name = {m.variant: m for m in measurements}
    if "baseline" not in by_name:
        raise UsageError("slo compare: no baseline run to compare against")
    base = by_name["baseline"]
    rows = []
    for m in measurements:
        if m.variant == "batching":
            ttft = _ratio(base.ttft_p50_s, m.ttft_p50_s)
            tpot = _ratio(base.tpot_p50_s, m.tpot_p50_s)
            throughput = _ratio(base.throughput_tok_s, m.throughput_tok_s)
            cost = _ratio(base.cpu_s_per_1k_tokens, m.cpu_s_per_1k_tokens)
        else:
            ttft = _ratio(m.ttft_p50_s, base.ttft_p50_s)
            tpot = _ratio(m.tpot_p50_s, base.tpot_p50_s)
            throughput = _ratio(m.throughput_tok_s, base.throughput_tok_s)
            cost = _ratio(m.cpu_s_per_1k_tokens, base.cpu_s_per_1k_tokens)
        quality = "-" if m.agreement is None else f"{m.agreement:.0%} agree"
        rows.append(
            ImpactRow(m.variant, ttft, tpot, throughput, cost, quality, CLAIMS.get(m.variant))
        )
    return rows


def _range(r: Range) -> str:
    return f"{r[0]:g}x" if r[0] == r[1] else f"{r[0]:g}-{r[1]:g}x"


def _cell(value: float, claim: Range | None) -> str:
    text = f"{value:.2f}x"
    return text if claim is None else f"{text} ({_range(claim)})"


def format_matrix(measurements: list[Measurement]) -> str:
    """The impact matrix as text: measured ratio, the claimed range in parentheses."""
    header = ("variant", "TTFT", "TPOT", "throughput", "cost/1k tok", "quality")
    lines = [header]
    for row in impact(measurements):
        claim = row.claim
        lines.append(
            (
                row.variant,
                _cell(row.ttft, claim.ttft if claim else None),
                _cell(row.tpot, claim.tpot if claim else None),
                _cell(row.throughput, claim.throughput if claim else None),
                _cell(row.cost, claim.cost if claim else None),
                row.quality + (f" ({claim.quality})" if claim else ""),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    out.insert(1, "  ".join("-" * width for width in widths))
    out.append("")
    out.append(
        "measured ratio to baseline (industry claim in parentheses); cost = CPU s per 1k tokens"
    )
    absolute = ["", "absolute: variant  TTFT p50  TPOT p50  tok/s  CPU s/1k tok  wall s"]
    for m in measurements:
        extra = []
        if m.acceptance_rate is not None:
            extra.append(f"acceptance {m.acceptance_rate:.0%} ({ACCEPTANCE_BENCHMARK})")
        if m.prefix_hit_rate is not None:
            extra.append(f"prefix-cache hit rate {m.prefix_hit_rate:.0%} ({PREFIX_HIT_BENCHMARK})")
        absolute.append(
            f"  {m.variant:<13} {m.ttft_p50_s * 1000:7.1f} ms {m.tpot_p50_s * 1000:6.1f} ms "
            f"{m.throughput_tok_s:6.1f} {m.cpu_s_per_1k_tokens:8.2f} {m.wall_s:8.1f}"
            + ("  " + "; ".join(extra) if extra else "")
        )
    return "\n".join(out + absolute)


def chart_svg(measurements: list[Measurement]) -> str | None:
    """Grouped bars of the ratios with the claimed ranges as whiskers; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return None
    rows = [row for row in impact(measurements) if row.variant != "baseline"]
    if not rows:
        return None
    metrics = ("ttft", "tpot", "throughput", "cost")
    figure, axis = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(metrics)
    for index, metric in enumerate(metrics):
        xs = [i + (index - (len(metrics) - 1) / 2) * width for i in range(len(rows))]
        values = [getattr(row, metric) for row in rows]
        axis.bar(xs, values, width, label=metric.upper() if metric != "throughput" else metric)
        for x, row in zip(xs, rows, strict=True):
            if row.claim is not None:
                low, high = getattr(row.claim, metric)
                axis.plot([x, x], [low, high], color="black", linewidth=2)
    axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axis.set_xticks(range(len(rows)), [row.variant for row in rows])
    axis.set_ylabel("ratio to baseline")
    axis.set_title("measured impact (bars) and industry claims (black ranges)")
    axis.legend(fontsize=8, ncols=4)
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.find("<svg") :]


def render_html(measurements: list[Measurement], title: str) -> str:
    """A self-contained report: the matrix, the absolute numbers and the chart."""
    chart = chart_svg(measurements)
    chart_html = chart or "<p><em>Install matplotlib for the chart.</em></p>"
    descriptions = "".join(
        f"<li><b>{html.escape(m.variant)}</b>: {html.escape(DESCRIPTIONS.get(m.variant, ''))}</li>"
        for m in measurements
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><ul>{descriptions}</ul>"
        f"<pre>{html.escape(format_matrix(measurements))}</pre>{chart_html}</body></html>\n"
    )
