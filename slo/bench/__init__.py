"""`slo bench`: an OpenAI-compatible load generator that times each request at the client and
keeps the server's own timings next to them (see `slo.bench.client` for the definitions)."""

from slo.bench.client import Measurement, RequestSettings, measure
from slo.bench.command import BenchOptions, execute
from slo.bench.profiles import PROFILES, PlannedRequest, Profile, plan_requests
from slo.bench.runner import RunResult

__all__ = [
    "PROFILES",
    "BenchOptions",
    "Measurement",
    "PlannedRequest",
    "Profile",
    "RequestSettings",
    "RunResult",
    "execute",
    "measure",
    "plan_requests",
]
