"""The regression scenario through the generated rules: what Prometheus would send.

One tier's traffic, a minute at a time: a day and two hours healthy (the anomaly bands need
about a day of history), then prefill slower by a factor for an hour. promtool evaluates the
spec's generated rules over it and is asked, at the end, for every alert with an empty
expectation: its failure report lists what actually fired, labels and annotations as
Prometheus hands them to Alertmanager, and `ALERTS` gives when each first fired. Nothing
here predicts an alert: the alerts are the rules' own output.

`slo demo --scenario regression` feeds it the bundled engine's measured phase means and TTFT;
docs/alerts.md shows it on the packaged regression spec with `DEFAULT_PROFILE`
(`python -m alerts.regression --write docs/alerts.md` rewrites that example).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Any

import yaml

from alerts.policy_tests import counter_values
from alerts.rule_types import REQUESTS
from alerts.rules import Links, group_order, render_rules
from alerts.templating import render
from slo.errors import UsageError
from slo.promql import le_value
from slo.sli import BEFORE_FIRST_TOKEN, CATALOG, buckets_for
from slo.spec import SLOSpec

HEALTHY_MIN = 26 * 60  # a day for the bands' history, two hours of steady state
SLOW_MIN = 60
EVALUATION_INTERVAL = "1m"
_LABELS = 'model="bundled:tiny", route="/v1/completions"'
_SERIES = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
DOC_BEGIN = "<!-- regression-example: begin (python -m alerts.regression --write) -->"
DOC_END = "<!-- regression-example: end -->"


@dataclass(frozen=True)
class Profile:
    """One tier's traffic, healthy and regressed: per-request phase means and TTFT values
    (a sample whose distribution every minute repeats), both in seconds."""

    requests_per_min: int
    means: tuple[dict[str, float], dict[str, float]]  # healthy, regressed
    ttft_s: tuple[tuple[float, ...], tuple[float, ...]]
    tpot_s: float

    def e2e_s(self, slow: bool) -> float:
        return sum(self.means[slow].values())


def _lognormal(median_s: float, sigma: float, n: int = 200) -> tuple[float, ...]:
    """n evenly spaced quantiles: a deterministic sample of the distribution."""
    normal = NormalDist()
    return tuple(
        median_s * 2.718281828459045 ** (sigma * normal.inv_cdf((i + 0.5) / n)) for i in range(n)
    )


def synthetic_profile(factor: float = 2.0) -> Profile:
    """The bundled engine's shape on a CPU (prefill most of the TTFT), prefill `factor`x
    slower; TTFT is the sum of the phases before the first token, spread +-10%."""
    healthy = {
        "network": 0.004,
        "other": 0.006,
        "queue": 0.01,
        "prefill": 0.1,
        "decode": 0.6,
        "detokenize": 0.002,
    }
    slow = {**healthy, "prefill": healthy["prefill"] * factor}
    ttft = tuple(
        _lognormal(sum(m.get(p, 0.0) for p in BEFORE_FIRST_TOKEN), 0.1) for m in (healthy, slow)
    )
    return Profile(600, (healthy, slow), (ttft[0], ttft[1]), 0.03)


DEFAULT_PROFILE = synthetic_profile()


def _histogram(metric: str, base: str, bounds: list[float], minutes: list[list[float]]) -> Any:
    edges = [*(le_value(b) for b in bounds), "+Inf"]
    limits = [*bounds, float("inf")]
    rows = [
        {
            "series": f'{metric}_bucket{{{base}, le="{edge}"}}',
            "values": counter_values([sum(v <= limit for v in m) for m in minutes]),
        }
        for edge, limit in zip(edges, limits, strict=True)
    ]
    rows.append(
        {"series": f"{metric}_count{{{base}}}", "values": counter_values([len(m) for m in minutes])}
    )
    return rows


def _sums(metric: str, base: str, count: int, means: list[float]) -> list[dict[str, str]]:
    total, values = 0.0, ["0"]
    for mean in means:
        total += mean * count
        values.append(repr(round(total, 6)))
    return [
        {"series": f"{metric}_sum{{{base}}}", "values": " ".join(values)},
        {"series": f"{metric}_count{{{base}}}", "values": counter_values([count] * len(means))},
    ]


def _stretched(sample: tuple[float, ...], n: int) -> list[float]:
    """n values distributed as `sample`: a minute's requests from a smaller sample."""
    ordered = sorted(sample)
    return [ordered[i * len(ordered) // n] for i in range(n)]


def input_series(spec: SLOSpec, tier: str, profile: Profile) -> list[dict[str, str]]:
    """The tier's counters from 0, one sample a minute: healthy, then regressed."""
    base = f'tier="{tier}", {_LABELS}'
    slow = [False] * HEALTHY_MIN + [True] * SLOW_MIN
    n = profile.requests_per_min
    series = [
        {"series": f'{REQUESTS}{{{base}, outcome="ok"}}', "values": counter_values([n] * len(slow))}
    ]
    ttft = [_stretched(profile.ttft_s[s], n) for s in (0, 1)]
    series += _histogram(
        CATALOG["ttft"].metric, base, buckets_for("ttft", spec), [ttft[s] for s in slow]
    )
    series += _histogram(
        CATALOG["tpot"].metric,
        base,
        buckets_for("tpot", spec),
        [[profile.tpot_s] * n for _ in slow],
    )
    series += _histogram(
        CATALOG["e2e"].metric,
        base,
        buckets_for("e2e", spec),
        [[profile.e2e_s(s)] * n for s in slow],
    )
    for phase in profile.means[0]:
        series += _sums(CATALOG[phase].metric, base, n, [profile.means[s][phase] for s in slow])
    series += _sums(CATALOG["e2e"].metric, base, n, [profile.e2e_s(s) for s in slow])
    return series


@dataclass
class Fired:
    """One alert at the end of the scenario, as Prometheus sends it to Alertmanager."""

    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    first_fired_min: float | None = None  # minutes after prefill slowed

    def name(self) -> str:
        return self.labels["alertname"]


def _parse(text: str) -> dict[str, str]:
    return {key: json.loads(f'"{value}"') for key, value in _SERIES.findall(text)}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise UsageError(
            "promtool: not found on PATH; install Prometheus (Debian: apt install prometheus)"
        )
    return found


def run_scenario(spec: SLOSpec, profile: Profile, tier: str | None = None) -> list[Fired]:
    """Every alert firing an hour into the regression, in the order they first fired."""
    tier = tier or spec.tiers[0].name
    rules = render_rules(spec, Links())
    end = f"{HEALTHY_MIN + SLOW_MIN}m"
    groups = yaml.safe_load(rules)["groups"]
    names = sorted({r["alert"] for g in groups for r in g["rules"] if "alert" in r})
    group = {
        "name": f"{tier}: prefill slower after {HEALTHY_MIN} minutes",
        "interval": "1m",
        "input_series": input_series(spec, tier, profile),
        "alert_rule_test": [{"eval_time": end, "alertname": n, "exp_alerts": []} for n in names],
        "promql_expr_test": [
            {
                "expr": (
                    f'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{end}:1m]) / 60'
                    f" - {HEALTHY_MIN}"
                ),
                "eval_time": end,
                "exp_samples": [],
            }
        ],
    }
    with tempfile.TemporaryDirectory(prefix="llm-slo-regression-") as scratch:
        Path(scratch, "rules.yml").write_text(rules, "utf-8")
        test = render(
            "rules_test.yml.j2",
            rules_file="rules.yml",
            groups=[group],
            evaluation_interval=EVALUATION_INTERVAL,
            group_eval_order=group_order(spec),
            source="alerts.regression",
        )
        Path(scratch, "test.yml").write_text(test, "utf-8")
        command = [_promtool(), "test", "rules", "test.yml"]
        result = subprocess.run(
            command, cwd=scratch, capture_output=True, text=True, timeout=900, check=False
        )
    output = result.stdout + result.stderr
    if result.returncode == 0:
        return []  # every expectation held: nothing fired
    if "got:" not in output:
        raise UsageError(f"promtool could not run the regression scenario: {output[-2000:]}")
    return _fired(output)


def _fired(output: str) -> list[Fired]:
    """Alerts and first-firing times from promtool's report of what it got."""
    alerts = [
        Fired(_parse(labels), _parse(annotations))
        for labels, annotations in re.findall(r"Labels:(\{.*\})\n\s*Annotations:(\{.*\})", output)
    ]
    for labels, value in re.findall(r"(\{[^{}\n]*\}) (-?[0-9.]+E[+-][0-9]+)", output):
        first = {k: v for k, v in _parse(labels).items() if k != "alertstate"}
        for alert in alerts:
            if alert.labels == first:
                alert.first_fired_min = float(value)
    return sorted(alerts, key=lambda a: (a.first_fired_min is None, a.first_fired_min or 0))


def _shown(alert: Fired) -> list[str]:
    lines = ["labels:"] + [f"  {k}: {v}" for k, v in sorted(alert.labels.items())]
    lines.append("annotations:")
    return lines + [f"  {k}: {v}" for k, v in sorted(alert.annotations.items())]


def render_example(alerts: list[Fired]) -> str:
    """When each alert first fired, then the first info and the first page in full."""
    lines = ["minutes after prefill slowed, alert, labels that say why:"]
    for alert in alerts:
        when = "?" if alert.first_fired_min is None else f"+{alert.first_fired_min:g}m"
        why = " ".join(
            f"{k}={alert.labels[k]}" for k in ("anomaly", "sli", "phase") if k in alert.labels
        )
        lines.append(f"  {when:>5}  {alert.labels.get('urgency', ''):<6}  {alert.name()}  {why}")
    for urgency in ("info", "page"):
        shown = [
            a for a in alerts if a.labels.get("urgency") == urgency and "phase" in a.annotations
        ]
        if shown:
            lines += ["", f"the first {urgency}, as Alertmanager shows it:", *_shown(shown[0])]
    return "\n".join(lines)


def packaged_spec() -> SLOSpec:
    return SLOSpec.from_yaml(
        resources.files("slo").joinpath("examples/regression.yaml").read_text("utf-8")
    )


def doc_block(text: str) -> str:
    return f"{DOC_BEGIN}\n```text\n{text}\n```\n{DOC_END}"


def write_doc(path: Path) -> None:
    """Replace the example between the markers of `path` with what promtool says now."""
    page = path.read_text("utf-8")
    if DOC_BEGIN not in page or DOC_END not in page:
        raise UsageError(f"{path}: no '{DOC_BEGIN}' ... '{DOC_END}' block to rewrite; add one")
    head, rest = page.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    example = render_example(run_scenario(packaged_spec(), DEFAULT_PROFILE))
    path.write_text(head + doc_block(example) + tail, "utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write_doc(Path(sys.argv[2]))
    else:
        print(render_example(run_scenario(packaged_spec(), DEFAULT_PROFILE)))
