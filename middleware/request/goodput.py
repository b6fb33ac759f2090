"""Whether a finished request is good for goodput: ok, and every per-request latency objective
of its tier met (`slo.arithmetic.good_request`, the records judge's rule for one request) on
the values its record keeps (one that produced no tokens keeps e2e and the phases:
`middleware.request.reporting.kept_without_tokens`).

The reporter decides once per request and gives the answer to the good-requests counter
(`llm_slo_good_requests_total`, `middleware.metrics.metric_set`) and to the live windows
(`/slo`, the in-process alerts), so records, Prometheus and `/slo` count the same requests.
"""

from __future__ import annotations

from functools import partial

from middleware.request.reporting import kept_without_tokens
from middleware.request.timeline import Breakdown
from slo.arithmetic import GoodputCheck, good_request, goodput_checks
from slo.spec import SLOSpec


class GoodRequests:
    """The goodput checks of every tier of a spec, made once; `good` per request."""

    def __init__(self, spec: SLOSpec) -> None:
        self.checks: dict[str, tuple[GoodputCheck, ...]] = {
            tier.name: goodput_checks(tier.latency_objectives) for tier in spec.tiers
        }
        # A value the record does not keep is missing, and a missing value passes.
        self._without_tokens = {
            tier: tuple(check for check in checks if kept_without_tokens(check.field))
            for tier, checks in self.checks.items()
        }

    def good(
        self, tier: str, outcome: str, breakdown: Breakdown | None, produced: bool = True
    ) -> bool:
        """Whether one finished request of `tier` is good; `produced`: whether it produced
        tokens. A request reported without a breakdown is not good."""
        if breakdown is None:
            return False
        checks = (self.checks if produced else self._without_tokens).get(tier, ())
        return good_request(outcome == "ok", checks, partial(getattr, breakdown))
