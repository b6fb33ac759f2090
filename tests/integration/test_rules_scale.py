"""The full generated rule set holds at fleet scale: promtool evaluates every rule of the
example spec over 8 days of 1-minute samples without a single evaluation error.

promtool refuses a query that loads more than 10,000 samples, the tripwire of a rule that
reads raw series over days: `increase(...[30d])` over 8 days of 1-minute samples loads 11,520
per series. Long windows add recorded tiles instead (`alerts.records`: 5-minute ones up to 6h,
hourly ones past it), so the 30d SLO window reads 192 hourly tiles here and 720 at most. The
test also checks that the derived windows count exactly what `increase()` over the raw series
counts at a whole hour.

Rules are evaluated every 5 minutes, the finest tile (a tile must be recorded at each step its
sums read): what a query loads depends on its range and the samples' density, not on how often
it runs, and 2,304 evaluations of the whole set take seconds where 11,520 take minutes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from alerts.records import FINE_TILE_S
from alerts.rules import REQUESTS, Links, group_order, render_rules
from alerts.templating import render
from slo.promql import le_value, prom_duration, record_bad, record_events, selector
from slo.sli import CATALOG, LATENCY_SLIS, buckets_for
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

DAYS = 8
STEPS = DAYS * 24 * 60
OK_PER_MIN = 20
BAD_EVERY_MIN = 1
LABELS = 'model="m", route="/v1/completions"'


def _counter(per_step: int) -> str:
    return f"0+{per_step}x{STEPS}"


def fleet_series(spec: SLOSpec) -> list[dict[str, str]]:
    """Every series a rule may read, for every tier: outcomes, every latency histogram's count
    and sum, and the buckets of those an objective judges, all observations in the lowest
    bucket (so every latency objective is met)."""
    series: list[dict[str, str]] = []
    for tier in spec.tiers:
        base = f'tier="{tier.name}", {LABELS}'
        for outcome, per_step in (("ok", OK_PER_MIN), ("server_error", BAD_EVERY_MIN)):
            series.append(
                {
                    "series": f'{REQUESTS}{{{base}, outcome="{outcome}"}}',
                    "values": _counter(per_step),
                }
            )
        judged = {o.sli for o in tier.latency_objectives}
        for sli in LATENCY_SLIS:
            metric = CATALOG[sli].metric
            edges = (
                (*(le_value(b) for b in buckets_for(sli, spec)), "+Inf") if sli in judged else ()
            )
            for edge in edges:
                series.append(
                    {"series": f'{metric}_bucket{{{base}, le="{edge}"}}', "values": _counter(10)}
                )
            series.append({"series": f"{metric}_count{{{base}}}", "values": _counter(10)})
            series.append({"series": f"{metric}_sum{{{base}}}", "values": _counter(1)})
    return series


def _expected_counts(spec: SLOSpec, eval_s: int) -> list[dict[str, Any]]:
    """3d events and bad events of premium's availability, from the tiles, against the raw."""
    tier = spec.tiers[0].name
    objective = next(o for o in spec.tiers[0].objectives if o.kind == "availability")
    labels = {"tier": tier, "sli": "availability", "objective": objective.name}
    shown = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    minutes = 3 * 24 * 60
    tests = []
    for record, value in (
        (record_events(3 * 86400), minutes * (OK_PER_MIN + BAD_EVERY_MIN)),
        (record_bad(3 * 86400), minutes * BAD_EVERY_MIN),
    ):
        tests.append(
            {
                "expr": selector(record, **labels),
                "eval_time": prom_duration(eval_s),
                "exp_samples": [{"labels": f"{record}{{{shown}}}", "value": value}],
            }
        )
    return tests


def test_full_rule_set_over_eight_days_of_minutes(tmp_path: Path) -> None:
    promtool = binary("promtool")
    spec = SLOSpec.default()
    (tmp_path / "rules.yml").write_text(render_rules(spec, Links()))
    eval_s = STEPS * 60
    group = {
        "name": "eight days, every rule, every minute",
        "interval": "1m",
        "input_series": fleet_series(spec),
        "alert_rule_test": [
            {
                "eval_time": prom_duration(eval_s),
                "alertname": "LLMSLOMetricsAbsent",
                "exp_alerts": [],
            }
        ],
        "promql_expr_test": _expected_counts(spec, eval_s),
    }
    text = render(
        "rules_test.yml.j2",
        rules_file="rules.yml",
        evaluation_interval=prom_duration(FINE_TILE_S),
        group_eval_order=group_order(spec),
        groups=[group],
        source="test_rules_scale",
    )
    (tmp_path / "rules_test.yml").write_text(text)
    result = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "too many samples" not in output, output[-3000:]
    assert result.returncode == 0, output[-3000:]
