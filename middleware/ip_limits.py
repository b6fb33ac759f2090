"""A request rate limit per client address, in memory that does not grow with the addresses.

    app = IpLimitMiddleware(app, IpRateLimiter(requests_per_minute=120),
                            trusted_proxies=["10.0.0.0/8"])

The client's address is the TCP peer's, unless the peer is a trusted proxy: then the
`X-Forwarded-For` chain is read from the right, skipping trusted proxies, and the first address
that is not one is the client (the left part of the chain is whatever the client wrote, so it is
never believed). IPv6 addresses count per /64: one host is usually given a whole /64, and
counting each of its 2^64 addresses apart would let it walk around its limit.

Why a sketch, not a table of buckets: a table keyed by address grows with every new address
(an attacker with a /48 of IPv6 has 2^80 of them), and an LRU of bounded size forgets an
address as soon as enough others pass, handing it a fresh bucket: with churn above its size,
nobody is limited. Here the state is fixed at construction: `rows` x `width` token buckets
(two float arrays, ~1 MiB by default). An address maps to one bucket in each row, by a keyed
hash (BLAKE2b with a random per-process key, so a client cannot choose addresses that collide
with another's); a request takes a token from each of its buckets, and is allowed while the
fullest of them holds one. Buckets shared with other addresses only ever hold less, so an
address is never allowed more than its limit (as a count-min sketch never under-counts); an
innocent address is wrongly limited only if every one of its buckets is shared with heavy
clients, about (heavy clients / width) ** rows: 1e-5 with 1,000 heavy clients at the defaults.

The refusal is the per-key limiter's: 429 in OpenAI's error shape with `Retry-After`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import threading
from array import array
from collections.abc import Iterable, Sequence

from middleware.auth import AuthDecision, refusal
from middleware.clock import Clock, SystemClock
from middleware.types import ASGIApp, Receive, Scope, Send

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class IpRateLimiter:
    """Token buckets of `requests_per_minute` (burst: the same number) per client address."""

    def __init__(
        self, requests_per_minute: float, rows: int = 4, width: int = 16384, now_s: float = 0.0
    ) -> None:
        if requests_per_minute <= 0:
            raise ValueError(f"requests_per_minute must be positive, got {requests_per_minute}")
        if not 1 <= rows <= 8 or width < 1 or width > 2**32:
            raise ValueError("rows must be 1..8 and width 1..2**32")
        self.capacity = float(requests_per_minute)
        self.rate_per_s = self.capacity / 60.0
        self.rows = rows
        self.width = width
        self._levels = array("d", [self.capacity]) * (rows * width)
        self._updated = array("d", [now_s]) * (rows * width)
        self._key = os.urandom(16)
        self._lock = threading.Lock()

    @property
    def state_bytes(self) -> int:
        """The memory the buckets take; fixed from construction."""
        return self._levels.itemsize * len(self._levels) * 2

    def cells(self, address: str) -> list[int]:
        """The bucket of `address` in each row (indices into the flat arrays)."""
        digest = hashlib.blake2b(address.encode(), key=self._key, digest_size=4 * self.rows)
        raw = digest.digest()
        return [
            row * self.width + int.from_bytes(raw[4 * row : 4 * row + 4], "little") % self.width
            for row in range(self.rows)
        ]

    def wait_s(self, address: str, now_s: float) -> float:
        """Take one request for `address` and return 0, or return the seconds until it may
        (nothing taken)."""
        cells = self.cells(address)
        levels, updated = self._levels, self._updated
        with self._lock:
            best = -math.inf
            for cell in cells:
                level = min(self.capacity, levels[cell] + (now_s - updated[cell]) * self.rate_per_s)
                levels[cell], updated[cell] = level, now_s
                best = max(best, level)
            if best < 1.0:
                return (1.0 - best) / self.rate_per_s
            for cell in cells:
                levels[cell] -= 1.0
        return 0.0


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
    """Pure ASGI: every HTTP request that reaches it is counted under its client's address."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: IpRateLimiter,
        trusted_proxies: Iterable[str] = (),
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.trusted = parse_networks(trusted_proxies)
        self.clock = clock or SystemClock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
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
            wait = self.limiter.wait_s(address, self.clock.wall_s())
            if wait > 0:
                message = f"rate limit of client address {address} reached; retry after {math.ceil(wait)} s"  # fmt: skip
                await refusal(AuthDecision(None, 429, message, wait))(scope, receive, send)
                return
        await self.app(scope, receive, send)
