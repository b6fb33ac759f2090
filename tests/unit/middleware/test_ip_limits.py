"""The per-address limiter, rule by rule: the bucket, Retry-After, one address's limit leaves
the others alone, X-Forwarded-For believed only from trusted proxies (right-most untrusted hop),
IPv6 per /64, fixed memory, and the 429 in the per-key limiter's shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from middleware.clock import ScriptedClock
from middleware.ip_limits import (
    IpLimitMiddleware,
    IpRateLimiter,
    client_address,
    parse_networks,
)
from middleware.types import Message, Receive, Scope, Send


def test_a_burst_of_the_limit_then_refill_at_the_rate() -> None:
    limiter = IpRateLimiter(requests_per_minute=6)  # one every 10 s, bursts of 6
    assert [limiter.wait_s("10.0.0.1", 100.0) for _ in range(6)] == [0.0] * 6
    assert limiter.wait_s("10.0.0.1", 100.0) == pytest.approx(10.0)
    assert limiter.wait_s("10.0.0.1", 105.0) == pytest.approx(5.0)  # refused: nothing taken
    assert limiter.wait_s("10.0.0.1", 110.0) == 0.0
    assert limiter.wait_s("10.0.0.1", 110.0) == pytest.approx(10.0)


def test_one_address_at_its_limit_leaves_the_others_alone() -> None:
    limiter = IpRateLimiter(requests_per_minute=3)
    for _ in range(3):
        assert limiter.wait_s("192.0.2.1", 0.0) == 0.0
    assert limiter.wait_s("192.0.2.1", 0.0) > 0
    others = [f"198.51.100.{n}" for n in range(200)]
    assert all(limiter.wait_s(address, 0.0) == 0.0 for address in others)


def test_full_buckets_are_forgotten_so_the_table_holds_only_recent_addresses() -> None:
    limiter = IpRateLimiter(requests_per_minute=60)  # full again 1 s after one request
    for n in range(1000):
        limiter.wait_s(f"10.0.{n // 256}.{n % 256}", n * 0.01)  # 100 new addresses a second
    assert len(limiter) <= 102  # about one second of them, not all 1,000
    assert limiter.forgotten_early == 0


def test_the_table_is_bounded_and_says_when_it_forgets_early() -> None:
    limiter = IpRateLimiter(requests_per_minute=2, max_addresses=100)
    for n in range(500):
        limiter.wait_s(f"10.1.{n // 256}.{n % 256}", 0.0)
    assert len(limiter) == 100
    assert limiter.forgotten_early == 400
    # Within the table, each address is still held to its limit.
    limiter.wait_s("10.1.1.243", 0.0)
    assert limiter.wait_s("10.1.1.243", 0.0) > 0


TRUSTED = parse_networks(["10.0.0.0/8", "::1"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("203.0.113.7", [], "203.0.113.7"),  # no proxy
        ("203.0.113.7", ["1.2.3.4"], "203.0.113.7"),  # untrusted peer: its header is ignored
        ("10.1.1.1", ["1.2.3.4"], "1.2.3.4"),  # trusted load balancer
        ("10.1.1.1", ["6.6.6.6, 1.2.3.4, 10.2.2.2"], "1.2.3.4"),  # right-most untrusted
        ("10.1.1.1", ["6.6.6.6", "1.2.3.4"], "1.2.3.4"),  # several headers: one list
        ("10.1.1.1", ["10.3.3.3, 10.2.2.2"], "10.3.3.3"),  # all trusted: the left-most
        ("10.1.1.1", ["6.6.6.6, garbage"], "10.1.1.1"),  # garbage: stop at the proxy
        ("10.1.1.1", [], "10.1.1.1"),  # trusted but no header
        ("::1", ["[2001:db8::1]:443"], "2001:db8::/64"),  # bracketed IPv6 with port
        ("2001:db8:0:1::5", [], "2001:db8:0:1::/64"),  # IPv6 per /64
        ("::ffff:198.51.100.9", [], "198.51.100.9"),  # IPv4-mapped IPv6
        (None, [], None),  # a Unix socket has no address
    ],
)
def test_client_address(peer: str | None, forwarded: list[str], expected: str | None) -> None:
    assert client_address(peer, forwarded, TRUSTED) == expected


def test_a_bad_trusted_proxy_is_named() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300'"):
        parse_networks(["10.0.0.0/8", "10.0.0.300"])


def _request(
    app: Any,
    client: tuple[str, int] | None,
    headers: list[tuple[bytes, bytes]],
    path: str = "/v1/completions",
) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[Message] = []
    scope = {"type": "http", "path": path, "headers": headers, "client": client}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1].get("body", b"")


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_the_middleware_answers_429_with_retry_after_in_openai_shape() -> None:
    clock = ScriptedClock()
    app = IpLimitMiddleware(_ok, IpRateLimiter(2), ["10.0.0.0/8"], clock=clock)
    behind_lb = ("10.9.9.9", 5000)
    spoofer = ("203.0.113.50", 5000)
    forwarded = [(b"x-forwarded-for", b"198.51.100.1")]
    assert [_request(app, behind_lb, forwarded)[0] for _ in range(2)] == [200, 200]
    status, headers, body = _request(app, behind_lb, forwarded)
    assert status == 429 and headers[b"retry-after"] == b"30"
    error = json.loads(body)["error"]
    assert error["type"] == "rate_limit_error" and "198.51.100.1" in error["message"]
    # The load balancer's own address, and other clients behind it, are not limited.
    assert _request(app, behind_lb, [(b"x-forwarded-for", b"198.51.100.2")])[0] == 200
    # A direct client cannot escape its limit by writing X-Forwarded-For.
    assert [_request(app, spoofer, [])[0] for _ in range(2)] == [200, 200]
    assert _request(app, spoofer, [(b"x-forwarded-for", b"192.0.2.99")])[0] == 429


def test_health_checks_are_never_limited() -> None:
    app = IpLimitMiddleware(_ok, IpRateLimiter(1), clock=ScriptedClock())
    balancer = ("10.0.0.2", 9000)
    assert [_request(app, balancer, [], "/health")[0] for _ in range(5)] == [200] * 5
    assert _request(app, balancer, [])[0] == 200  # its budget is untouched
    assert _request(app, balancer, [])[0] == 429
