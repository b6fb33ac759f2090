"""PromQL shared by the dashboard's rows: rates, percentiles and means over the catalog's
metrics, each filtered on the dashboard's variables.

Percentiles are `histogram_quantile` over `rate(<metric>_bucket[$__rate_interval])`, means
are `rate(_sum) / rate(_count)` (a phase's over every measured request: `phase_mean_expr`);
every query sums over replicas, so two replicas read as one service, and filters on the
dashboard's tier, model and instance variables.
"""

from __future__ import annotations

from slo.promql import matcher, selector
from slo.sli import CATALOG

RATE = "$__rate_interval"
QUANTILES: tuple[str, ...] = ("0.5", "0.95", "0.99")


def request_filter(*extra: str) -> tuple[str, ...]:
    return (
        matcher("tier", "=~", "$tier"),
        matcher("model", "=~", "$model"),
        matcher("instance", "=~", "$instance"),
        *extra,
    )


def engine_filter(*extra: str) -> tuple[str, ...]:
    return (matcher("model", "=~", "$model"), matcher("instance", "=~", "$instance"), *extra)


def summed_rate(metric: str, by: str = "", *matchers: str) -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({selector(metric, *matchers)}[{RATE}]))"


def percentile_legend(prefix: str, quantile: str) -> str:
    """`{{tier}} p95` for quantile 0.95."""
    return f"{prefix} p{float(quantile) * 100:g}"


def quantile_expr(sli: str, quantile: str, by: str = "tier") -> str:
    metric = CATALOG[sli].metric + "_bucket"
    return (
        f"histogram_quantile({quantile}, "
        f"{summed_rate(metric, f'{by}, le' if by else 'le', *request_filter())})"
    )


def phase_mean_expr(phase: str) -> str:
    """A phase's seconds per measured request: its time over every request measured (the e2e
    histogram's count), not over the requests that reported the phase. So the phases add up
    to the mean e2e, as a request's do, and a phase no request had reads 0: an engine that
    reports queue and prefill apart never has queue_prefill, one seen only on the wire has
    only queue_prefill, and the phase's own mean would be 0/0 (NaN)."""
    requests = CATALOG["e2e"].metric + "_count"
    return (
        f"{summed_rate(CATALOG[phase].metric + '_sum', '', *request_filter())}\n/\n"
        f"{summed_rate(requests, '', *request_filter())}"
    )


def mean_expr(sli: str, by: str = "tier") -> str:
    metric = CATALOG[sli].metric
    filters = request_filter() if "tier" in CATALOG[sli].labels else engine_filter()
    return (
        f"{summed_rate(metric + '_sum', by, *filters)}\n/\n"
        f"{summed_rate(metric + '_count', by, *filters)}"
    )
