"""A panel's query results against what they should be: every series there, no other, each value
a number, equal to its expected value, or for a percentile within bucket precision.

Expected values per target: `{labels: Exact(v) | Quantile(q, values, bounds)}`, labels as the
query's result carries them (the metric name left out). A percentile estimated by
`histogram_quantile` interpolates inside the bucket its rank falls in, so the nearest-rank
value of the requests (`slo.check.evaluate.rank_for`, the records' judge) lies in the bucket the
estimate lies in; at a bucket edge, in either of the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from slo.check.evaluate import rank_for

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Exact:
    value: float


@dataclass(frozen=True)
class Quantile:
    q: float
    values: tuple[float, ...]
    bounds: tuple[float, ...]  # the histogram's finite bucket bounds

    @property
    def true_value(self) -> float:
        return sorted(self.values)[rank_for(self.q, len(self.values)) - 1]


Expected = Exact | Quantile
Series = dict[Labels, Expected]


def labels(**pairs: str) -> Labels:
    return frozenset(pairs.items())


def _buckets_holding(estimate: float, bounds: Sequence[float]) -> list[tuple[float, float]]:
    """The buckets [lower, upper] the estimate lies in (two at an edge), the first from 0."""
    edges = (0.0, *bounds, math.inf)
    near = 1e-9 * max(1.0, abs(estimate))
    return [
        (lower, upper)
        for lower, upper in pairwise(edges)
        if lower - near <= estimate <= upper + near
    ]


def mismatch(value: float, expected: Expected) -> str | None:
    """Why `value` is not what was expected; None when it is."""
    if math.isnan(value):
        return "NaN"
    if isinstance(expected, Exact):
        if math.isclose(value, expected.value, rel_tol=1e-9, abs_tol=1e-12):
            return None
        return f"{value!r}, expected {expected.value!r}"
    true = expected.true_value
    buckets = _buckets_holding(value, expected.bounds)
    if any(lower <= true <= upper for lower, upper in buckets):
        return None
    return (
        f"p{expected.q * 100:g} estimate {value!r} lies in {buckets}, the requests' nearest-rank "
        f"p{expected.q * 100:g} {true!r} (of {len(expected.values)}) does not"
    )


def _result(series: Iterable[Mapping[str, Any]]) -> dict[Labels, float]:
    found: dict[Labels, float] = {}
    for one in series:
        key = frozenset((k, v) for k, v in one["metric"].items() if k != "__name__")
        assert key not in found, f"two series with labels {sorted(key)}"
        found[key] = float(one["value"][1])
    return found


def panel_problems(
    title: str, results: Sequence[list[dict[str, Any]]], expected: Sequence[Series]
) -> list[str]:
    """What is wrong with a panel: per target (A, B, ...), no data, a missing or unexpected
    series, a NaN, a value off."""
    if len(results) != len(expected):
        return [f"{title}: {len(results)} targets, {len(expected)} expected"]
    problems = []
    for index, (series, want) in enumerate(zip(results, expected, strict=True)):
        where = f"{title} [{chr(ord('A') + index)}]"
        got = _result(series)
        if not got:
            problems.append(f"{where}: no data")
            continue
        for key in sorted(set(want) - set(got), key=sorted):
            problems.append(f"{where}: no series {dict(key)}")
        for key in sorted(set(got) - set(want), key=sorted):
            problems.append(f"{where}: unexpected series {dict(key)} = {got[key]}")
        for key in sorted(set(got) & set(want), key=sorted):
            wrong = mismatch(got[key], want[key])
            if wrong is not None:
                problems.append(f"{where} {dict(key)}: {wrong}")
    return problems
