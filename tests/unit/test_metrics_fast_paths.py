"""The fast observe paths give exactly what prometheus_client's own `observe` gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from middleware.metrics import observe_many, observe_one

BOUNDS = (0.001, 0.01, 0.1, 0.25, 1.0, 10.0)


def samples(histogram: Histogram) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in histogram.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=60))
def test_fast_paths_match_observe(values: list[float]) -> None:
    reference = Histogram("h", "d", buckets=BOUNDS, registry=CollectorRegistry())
    one = Histogram("h", "d", buckets=BOUNDS, registry=CollectorRegistry())
    many = Histogram("h", "d", buckets=BOUNDS, registry=CollectorRegistry())
    for value in values:
        reference.observe(value)
        observe_one(one, BOUNDS, value)
    observe_many(many, BOUNDS, values)
    expected = samples(reference)
    for fast in (samples(one), samples(many)):
        assert fast.keys() == expected.keys()
        for key, value in expected.items():
            assert abs(fast[key] - value) <= 1e-9 * max(1.0, abs(value))
