"""The regression scenario through the generated rules (alerts/regression.py), with promtool:
prefill 2x slower raises an info anomaly naming prefill before any page, the page names
prefill too, and docs/alerts.md shows exactly what promtool reports firing."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.regression import (
    DEFAULT_PROFILE,
    doc_block,
    packaged_spec,
    render_example,
    run_scenario,
    synthetic_profile,
)
from tests.helpers.binaries import binary

DOC = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"


@pytest.mark.timeout(900)
def test_prefill_regression_is_explained_before_it_pages_and_the_doc_shows_it() -> None:
    binary("promtool")
    fired = run_scenario(packaged_spec(), DEFAULT_PROFILE)
    infos = [a for a in fired if a.labels["urgency"] == "info"]
    pages = [a for a in fired if a.labels["urgency"] == "page"]
    assert infos and pages, [a.labels for a in fired]
    assert all(a.first_fired_min is not None for a in fired)
    ttft_info = next(a for a in infos if a.labels.get("anomaly") == "ttft_p95")
    assert ttft_info.labels["phase"] == "prefill"
    assert (ttft_info.first_fired_min or 0) <= 10  # the issue: within 10 minutes
    assert min(a.first_fired_min or 0 for a in pages) > (ttft_info.first_fired_min or 0)
    assert {a.labels["phase"] for a in pages} == {"prefill"}
    assert "prefill grew most" in pages[0].annotations["phase"]
    assert doc_block(render_example(fired)) in DOC.read_text(), (
        "docs/alerts.md's regression example is not what promtool reports now; "
        "rewrite it: python -m alerts.regression --write docs/alerts.md"
    )


@pytest.mark.timeout(900)
def test_without_a_regression_nothing_fires() -> None:
    binary("promtool")
    healthy = synthetic_profile(factor=1.0)
    assert run_scenario(packaged_spec(), healthy) == []
