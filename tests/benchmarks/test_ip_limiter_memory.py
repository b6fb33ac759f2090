"""The per-address limiter under address churn: memory flat past 100,000 distinct addresses
(200,000 are sent: the second 100,000 must add nothing), and each address still limited;
against the per-key limiter's structure (a dict of `TokenBucket`s, one per key, never
dropped) fed the same requests.

Two workloads, each 200,000 addresses sending `LIMIT + 1` requests back to back (the last one
must be refused, none before it):
- churn: 200 new addresses a second (over 1,000 simulated seconds): the table holds about a
  minute of them;
- flood: all within two seconds: more than the table holds; it stays at its bound (65,536).

Memory is what tracemalloc counts for each structure (Python allocations: exact, and not
disturbed by the rest of the process). Run alone, by hand:

    python -m pytest tests/benchmarks/test_ip_limiter_memory.py -o addopts= -s -p no:cacheprovider

Writes docs/benchmarks/ip-limiter.md.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from middleware.auth import TokenBucket
from middleware.ip_limits import IpRateLimiter
from tests.benchmarks.bench_record import load_average, stamp, table, write_section

ADDRESSES = 200_000
LIMIT = 5  # requests a minute, and the burst
CHECKPOINTS = (50_000, 100_000, 150_000, 200_000)
PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "ip-limiter.md"


def _address(n: int) -> str:
    return f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


class _DictPeer:
    """The per-key limiter's structure: one TokenBucket per name in a dict."""

    def __init__(self) -> None:
        self.buckets: dict[str, TokenBucket] = {}

    def wait_s(self, address: str, now_s: float) -> float:
        bucket = self.buckets.setdefault(address, TokenBucket(LIMIT, now_s))
        wait = bucket.wait_s(1, now_s)
        if wait == 0:
            bucket.take(1, now_s)
        return wait


def _run(
    make: Callable[[], IpRateLimiter | _DictPeer], per_second: float
) -> tuple[dict[int, int], int, int]:
    """(memory in bytes at each checkpoint, addresses limited on request LIMIT + 1, addresses
    refused earlier); memory counted from the structure's creation."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    limiter = make()
    memory: dict[int, int] = {}
    limited = refused_early = 0
    for n in range(ADDRESSES):
        address, now_s = _address(n), n / per_second
        waits = [limiter.wait_s(address, now_s) for _ in range(LIMIT + 1)]
        refused_early += any(wait > 0 for wait in waits[:LIMIT])
        limited += waits[LIMIT] > 0
        if n + 1 in CHECKPOINTS:
            memory[n + 1] = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return memory, limited, refused_early


def _mib(value: int) -> str:
    return f"{value / 2**20:.2f}"


def test_ip_limiter_memory_is_flat_and_every_address_is_limited() -> None:
    load_at_start = load_average()
    rows = []
    results = {}
    for workload, per_second in (("churn", 200.0), ("flood", ADDRESSES / 2.0)):
        for name, make in (
            ("IpRateLimiter", lambda: IpRateLimiter(LIMIT)),
            ("dict of TokenBucket (peer)", _DictPeer),
        ):
            memory, limited, early = _run(make, per_second)
            results[workload, name] = memory, limited, early
            rows.append(
                [workload, name, *(_mib(memory[c]) for c in CHECKPOINTS), f"{limited:,}", early]
            )
    header = ["workload", "structure", *(f"MiB at {c:,}" for c in CHECKPOINTS)]
    header += [f"limited on request {LIMIT + 1}", "refused early"]
    text = (
        f"{stamp(load_at_start)}\n\n{ADDRESSES:,} distinct addresses, each sending "
        f"{LIMIT + 1} requests back to back at a limit of {LIMIT} a minute; churn: 200 new "
        "addresses a second; flood: all within two seconds (the table's bound is 65,536).\n\n"
        + table(header, rows)
    )
    print("\n" + text)
    write_section(PAGE, "Per-address rate limiter", "ip-limiter-memory", text)
    for workload in ("churn", "flood"):
        memory, limited, early = results[workload, "IpRateLimiter"]
        peer_memory = results[workload, "dict of TokenBucket (peer)"][0]
        assert limited == ADDRESSES and early == 0, (workload, limited, early)
        # Flat: the second 100,000 addresses add (almost) nothing to the first.
        assert memory[200_000] <= memory[100_000] * 1.05 + 64 * 1024, (workload, memory)
        assert memory[200_000] < peer_memory[200_000] / 2, (workload, memory, peer_memory)
