"""Histogram bucket boundaries of the SLI catalog (`slo.sli`), in the SLI's unit.

The OpenTelemetry GenAI semantic conventions' explicit bucket boundary advisories are the base
(`slo.genai` names the commit they come from); ours where the conventions give none.
`slo.sli.buckets_for` adds every threshold a spec sets, so each threshold is a boundary.
"""

from __future__ import annotations

OTEL_TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
OTEL_TPOT_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
OTEL_DURATION_BUCKETS: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
OTEL_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
# Phases of one request are often sub-millisecond on a warm engine: finer at the low end.
PHASE_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
COLD_START_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300)
# Prefill chunks in one scheduler step (chunked prefill under a token budget).
CHUNK_BUCKETS: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
