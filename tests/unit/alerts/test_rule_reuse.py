"""Rules that read a record of their own group come after it, so they read this evaluation's
value (what the raw expression would give), and raw series are summed once per window."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from alerts.quantiles import LEVEL
from alerts.rules import Links, group_order, rule_groups
from slo.spec import SLOSpec

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@pytest.fixture(scope="module")
def groups() -> list:
    return rule_groups(SLOSpec.default(), Links())


def test_every_record_a_rule_reads_from_its_group_is_written_before_it(groups: list) -> None:
    for group in groups:
        written = {rule.record for rule in group.rules if rule.record}
        seen: set[str] = set()
        for rule in group.rules:
            read = set(_NAME.findall(rule.expr)) & written
            ahead = read - seen - {rule.record}
            assert not ahead, f"{group.name}: {rule.record or rule.alert} reads {ahead} first"
            if rule.record:
                seen.add(rule.record)


def test_quantiles_read_recorded_bucket_rates(groups: list) -> None:
    for group in groups:
        for rule in group.rules:
            if "histogram_quantile" in rule.expr:
                assert "_bucket{" not in rule.expr.split("histogram_quantile", 1)[1].split(")")[0]
                assert f"{LEVEL}:" in rule.expr, rule.expr


def test_each_raw_range_is_summed_once_per_group(groups: list) -> None:
    """No raw `increase` or `rate` over the same selector and window twice in a group (the
    percentile alerts' low-traffic guards, `increase` of a `_count`, are the exception)."""
    for group in groups:
        ranges = Counter(
            found
            for rule in group.rules
            for found in re.findall(
                r"((?:increase|rate)\(llm_slo_[a-z_]+\{[^}]*\}\[\w+\])", rule.expr
            )
        )
        repeated = {r: n for r, n in ranges.items() if n > 1 and "_count{" not in r}
        assert not repeated, f"{group.name}: {repeated}"


def test_fast_groups_never_read_what_only_a_slow_group_records(groups: list) -> None:
    """A fast group reading a slow group's record would read it a minute late (and in
    promtool, which evaluates the fast group first, one step late)."""
    slow = {r.record for g in groups if g.interval for r in g.rules if r.record}
    fast = {r.record for g in groups if not g.interval for r in g.rules if r.record}
    for group in groups:
        if group.interval:
            continue
        for rule in group.rules:
            read = set(_NAME.findall(rule.expr)) & (slow - fast)
            assert not read, f"{group.name}: {rule.record or rule.alert} reads {read}"


def test_pages_are_evaluated_every_cycle_and_promtool_runs_fast_groups_first(groups: list) -> None:
    for group in groups:
        severities = {r.labels.get("severity") for r in group.rules if r.alert}
        assert not (group.interval and "critical" in severities), group.name
    order = group_order(SLOSpec.default())
    assert order == [group.name for group in groups]
    for group in groups:
        if group.interval:
            fast = group.name.removesuffix("-slow")
            assert order.index(fast) < order.index(group.name)
