"""A request rate limit per client address, in memory bounded however many addresses come.

    app = IpLimitMiddleware(app, IpRateLimiter(requests_per_minute=120),
                            trusted_proxies=["10.0.0.0/8"])

The client's address is the TCP peer's, unless the peer is a trusted proxy: then the
`X-Forwarded-For` chain is read from the right, skipping trusted proxies, and the first address
that is not one is the client (the left part of the chain is whatever the client wrote, so it is
never believed). IPv6 addresses count per /64: one host is usually given a whole /64, and
counting each of its 2^64 addresses apart would let it walk around its limit.

Memory: one small bucket per address seen within the last refill period, in a table bounded
at `max_addresses` (65,536 by default: ~20 MiB at most). A bucket that has refilled to full
carries no information (a new one would be the same), so the least recently seen buckets are
dropped as soon as they are full: the table holds the addresses active within the last
minute, not every address ever seen, and 100,000 addresses passing through leave it as small
as the traffic of one minute. Only when more than `max_addresses` addresses are active within
one minute is a bucket forgotten before it is full, the least recently seen one first (the
one refilling the longest); `forgotten_early` counts those, so a table too small shows. Each
address is limited exactly while its bucket is kept. Why not a count-min sketch of buckets:
its memory is fixed, but every address shares its cells with others, so with 100,000 active
addresses and any affordable width, innocent addresses are refused for their neighbours'
traffic; a wrong 429 is worse than a forgotten bucket for a client idle the longest.

The refusal is the per-key limiter's: 429 in OpenAI's error shape with `Retry-After`.
"""

from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from middleware.auth import AuthDecision, refusal
from middleware.clock import Clock, SystemClock
from middleware.types import ASGIApp, Receive, Scope, Send

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class IpRateLimiter:
    """Token buckets of `requests_per_minute` (burst: the same number) per client address."""

    def __init__(self, requests_per_minute: float, max_addresses: int = 65536) -> None:
        if requests_per_minute <= 0:
            raise ValueError(f"requests_per_minute must be positive, got {requests_per_minute}")
        if max_addresses < 1:
            raise ValueError(f"max_addresses must be at least 1, got {max_addresses}")
        self.capacity = float(requests_per_minute)
        self.rate_per_s = self.capacity / 60.0
        self.max_addresses = max_addresses
        self.forgotten_early = 0  # buckets dropped before they were full: the table is too small
        # address -> [level, updated_s], least recently seen first
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def wait_s(self, address: str, now_s: float) -> float:
        """Take one request for `address` and return 0, or return the seconds until it may
        (nothing taken)."""
        with self._lock:
            self._drop_full(now_s)
            bucket = self._buckets.get(address)
            if bucket is None:
                if len(self._buckets) >= self.max_addresses:
                    self._buckets.popitem(last=False)
                    self.forgotten_early += 1
                bucket = self._buckets[address] = [self.capacity, now_s]
            else:
                self._buckets.move_to_end(address)
            level = min(self.capacity, bucket[0] + (now_s - bucket[1]) * self.rate_per_s)
            bucket[1] = now_s
            if level < 1.0:
                bucket[0] = level
                return (1.0 - level) / self.rate_per_s
            bucket[0] = level - 1.0
        return 0.0

    def _drop_full(self, now_s: float) -> None:
        """Forget the least recently seen buckets that have refilled (two at most a call: the
        table shrinks at up to twice the rate it can grow, with no sweep that stalls one)."""
        buckets = self._buckets
        for _ in range(2):
            if not buckets:
                return
            level, updated = next(iter(buckets.values()))
            if level + (now_s - updated) * self.rate_per_s < self.capacity:
                return
            buckets.popitem(last=False)


def parse_networks(specs: Iterable[str], where: str = "--trusted-proxies") -> list[IpNetwork]:
    """`10.0.0.0/8`, `127.0.0.1`, `::1` ... as networks; a bad one raises ValueError naming it."""
    networks: list[IpNetwork] = []
    for spec in specs:
        text = spec.strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(
                f"{where}: {text!r} is not an IP address or network (e.g. 10.0.0.0/8, ::1)"
            ) from None
    return networks


def client_address(
    peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[IpNetwork]
) -> str | None:
    """The address a request is counted under (None when there is none, e.g. a Unix socket):
    the peer, or, when the peer is a trusted proxy, the right-most untrusted X-Forwarded-For
    entry. IPv6 is reduced to its /64."""
    address = _parse(peer)
    if address is None:
        return None
    if _trusted(address, trusted):
        hops = [hop.strip() for header in forwarded_for for hop in header.split(",")]
        for hop in reversed(hops):
            parsed = _parse(hop)
            if parsed is None:
                break  # garbage in the chain: what lies left of it cannot be trusted either
            address = parsed
            if not _trusted(parsed, trusted):
                break
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _parse(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None


def _trusted(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, trusted: Sequence[IpNetwork]
) -> bool:
    return any(address in network for network in trusted)


class IpLimitMiddleware:
    """Pure ASGI: every HTTP request that reaches it is counted under its client's address,
    except those to `exempt_paths` (a load balancer's health checks must never get a 429)."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: IpRateLimiter,
        trusted_proxies: Iterable[str] = (),
        clock: Clock | None = None,
        exempt_paths: Iterable[str] = ("/health",),
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.trusted = parse_networks(trusted_proxies)
        self.clock = clock or SystemClock()
        self.exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        forwarded = (
            [
                v.decode("latin-1")
                for k, v in scope.get("headers", ())
                if k.lower() == b"x-forwarded-for"
            ]
            if self.trusted
            else []
        )
        address = client_address(client[0] if client else None, forwarded, self.trusted)
        if address is not None:
            # monotonic: a wall clock stepped back would drain every bucket
            wait = self.limiter.wait_s(address, self.clock.now_ns() / 1e9)
            if wait > 0:
                message = (
                    f"rate limit of client address {address} reached; "
                    f"retry after {math.ceil(wait)} s"
                )
                await refusal(AuthDecision(None, 429, message, wait))(scope, receive, send)
                return
        await self.app(scope, receive, send)
