"""Examples of a Hypothesis strategy drawn the same way every run, for a test that needs data
from the strategy without being a property test itself (one promtool run over many examples)."""

from __future__ import annotations

from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

T = TypeVar("T")


def drawn_examples(strategy: st.SearchStrategy[T], count: int) -> list[T]:
    """Up to `count` examples of `strategy`: derandomized and without the example database, so
    every run, alone or beside any other test, judges the same ones."""
    drawn: list[T] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(example: Any) -> None:
        drawn.append(example)

    draw()
    return drawn
