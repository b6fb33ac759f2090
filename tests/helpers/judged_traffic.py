"""The traffic the judges-agree properties draw: per one-minute step, good and bad requests of
one tier's availability objective (STEPS steps from ORIGIN_S, checked at CHECKS), the last step
tuned in some examples so the good count over the SLO window sits exactly on the target's
required count or one below it.

Every window of SPEC is at most 30 steps, so the live windows' slots (window / 60) are at most
half a step: events happen mid-step, and every judge holds the same events at each whole-minute
check.
"""

from __future__ import annotations

from hypothesis import strategies as st

from alerts.policy_tests import Traffic
from alerts.rules import Links
from slo.arithmetic import required_good
from slo.spec import SLOSpec
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

STEP_S = 60
STEPS = 30
CHECKS = (5, 10, 15, 20, 25, 30)
TARGET = "90%"
# Every window <= 30 steps, so live slots (W/60) are at most half a step: see the docstring.
SPEC = spec_yaml(
    make_tier("premium", f"availability >= {TARGET}", priority=0, default=True),
    window="30m",
    alert_policy=burn_policy(
        burn_alert("page", "30m", "5m", 5),
        burn_alert("page", "20m", "10m", 2),
        burn_alert("ticket", "30m", "10m", 1),
        min_events=10,
        thresholds=(),
    ),
)
# Wall origin on a multiple of every slot, so slot edges fall on whole seconds of the steps.
ORIGIN_S = 1_800_000_000 - 1_800_000_000 % 3600
SPEC_OBJ = SLOSpec.from_yaml(SPEC)
LINKS = Links()


@st.composite
def traffic(draw: st.DrawFn) -> Traffic:
    rates = draw(st.lists(st.integers(0, 12), min_size=STEPS, max_size=STEPS))
    bad_share = draw(st.lists(st.integers(0, 12), min_size=STEPS, max_size=STEPS))
    bad = [min(b, n) for b, n in zip(bad_share, rates, strict=True)]
    good = [n - b for n, b in zip(rates, bad, strict=True)]
    boundary = draw(st.sampled_from([None, 0, -1]))  # good exactly at the target, or one below
    if boundary is not None:
        events = sum(rates)
        need = required_good(SPEC_OBJ.tiers[0].objectives[0].target, events) + boundary
        shift = sum(good) - need  # move that many good events of the last step to bad
        if 0 <= shift <= good[-1]:
            good[-1] -= shift
            bad[-1] += shift
    return Traffic(tuple(good), tuple(bad))
