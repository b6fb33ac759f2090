"""Every panel of the generated dashboard checked by value, against the records (issue 43, item 4).

A known traffic (`tests.helpers.dashboard_traffic`: three tiers, two routes, every kind of
failure, engine steps, two GPUs, gen_ai.* metrics) is reported by the middleware and scraped
every 30 s; the scrapes go into a real Prometheus at the times they stand for, with the
generated recording rules the panels read evaluated over them
(`tests.helpers.prometheus_backfill`). Then every target of every panel is queried at one time,
`$__rate_interval` four scrapes, and each series is compared with what the records, the
engine's steps and the GPUs say (`tests.helpers.panel_expectations`,
`tests.helpers.engine_expectations`): exactly, or for a percentile within its bucket. An empty
result, a NaN, a missing or unexpected series fails, and so does a panel of the dashboard that
has no expectation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from alerts.rules import Links, rule_groups
from dashboards import panel_queries, render_dashboard, substitute
from slo.promql import prom_duration
from tests.helpers.dashboard_traffic import INSTANCE, QUERY_AT, SCRAPE_S, Known, known_traffic
from tests.helpers.engine_expectations import ENGINE
from tests.helpers.panel_checks import panel_problems
from tests.helpers.panel_expectations import RATE_S, Expectation, service_expectations
from tests.helpers.prometheus_backfill import backfilled_prometheus, needed_rules
from tests.helpers.prometheus_process import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Results = dict[str, list[list[dict[str, Any]]]]


def _charts(panels: list[dict[str, Any]]) -> Iterator[str]:
    """The title of every panel that charts something, collapsed rows' panels too."""
    for panel in panels:
        if panel.get("type") == "row":
            yield from _charts(panel.get("panels", []))
        elif panel.get("type") != "text":
            yield panel["title"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Known, list[str], Results]:
    """The traffic, the dashboard's chart titles, and each panel's results, target by target."""
    tmp_path: Path = tmp_path_factory.mktemp("dashboard-values")
    known = known_traffic(tmp_path)
    dashboard = render_dashboard(known.spec)
    queries = panel_queries(dashboard)
    every_rule = [rule for group in rule_groups(known.spec, Links()) for rule in group.rules]
    rules = needed_rules(every_rule, [q.expr for q in queries])
    target = {"instance": INSTANCE, "job": "llm-slo"}
    results: Results = {}
    interval = prom_duration(SCRAPE_S)
    with (
        backfilled_prometheus(tmp_path, known.scrapes, target, rules, interval) as url,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        exprs = [substitute(q.expr, prom_duration(RATE_S)) for q in queries]
        answers = pool.map(lambda expr: query(url, expr, at=QUERY_AT), exprs)
        for panel_query, answer in zip(queries, answers, strict=True):
            results.setdefault(panel_query.panel, []).append(answer)
    return known, list(_charts(json.loads(dashboard)["panels"])), results


def _expected(known: Known) -> dict[str, Expectation]:
    return {**service_expectations(known.spec), **ENGINE}


def test_every_panel_has_a_value_check(measured: tuple[Known, list[str], Results]) -> None:
    known, titles, results = measured
    assert len(set(titles)) == len(titles), f"two panels share a title: {sorted(titles)}"
    expected = _expected(known)
    unchecked = [title for title in titles if title not in expected]
    assert not unchecked, (
        f"panels without a value check: {unchecked}; add each one's expected series to "
        "tests/helpers/panel_expectations.py (service rows) or engine_expectations.py"
    )
    stale = sorted(set(expected) - set(titles))
    assert not stale, f"value checks of panels the dashboard no longer has: {stale}"
    assert not [title for title in titles if title not in results], "panels without targets"


def test_every_panel_shows_what_the_records_say(
    measured: tuple[Known, list[str], Results],
) -> None:
    known, _, results = measured
    problems = [
        problem
        for title, expected in _expected(known).items()
        if title in results
        for problem in panel_problems(title, results[title], expected(known))
    ]
    assert not problems, "\n".join(problems)
