"""Optional API-key authentication and per-key rate limits (token buckets).

Keys live in a YAML file as SHA-256 hashes, never in clear:

    keys:
      - id: acme-prod              # what records, tiers and logs see
        sha256: 5e884898da28...    # `slo keys new` writes this and prints the key once
        tier: premium              # optional: the tier this key's requests belong to
        requests_per_minute: 600   # optional limits, each a token bucket refilled evenly
        tokens_per_minute: 200000  # prompt + completion tokens, charged after each request

A request carries its key as `Authorization: Bearer KEY` or `X-API-Key: KEY`. A missing or
unknown key gets 401 with a generic message; a key over its limits gets 429 with Retry-After.

`ApiKeyMiddleware` is the ASGI layer: stacked inside `LatencyMiddleware` (which does it for
you with `SecurityConfig(auth=)`), its refusals are measured and recorded like any answer. What
it tells the layers around it goes in `scope["state"]`: `api_key_id`, the `tier` and
`priority` the key decides, and `charge_tokens(tokens)`, which the measuring layer calls with
the request's prompt and output tokens once they are counted (the key's tokens-per-minute
bucket).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from middleware.clock import Clock, SystemClock
from middleware.request.state import request_state
from middleware.types import ASGIApp, Receive, Scope, Send
from slo.errors import UsageError
from slo.spec import SLOSpec


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    sha256: str
    tier: str | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "sk-llmslo-" + secrets.token_urlsafe(24)


class TokenBucket:
    """`capacity` units, refilled at capacity per minute; may go negative after a charge."""

    def __init__(self, per_minute: float, now_s: float) -> None:
        self.capacity = per_minute
        self.rate_per_s = per_minute / 60.0
        self.level = per_minute
        self.updated = now_s

    def _refill(self, now_s: float) -> None:
        self.level = min(self.capacity, self.level + (now_s - self.updated) * self.rate_per_s)
        self.updated = now_s

    def wait_s(self, amount: float, now_s: float) -> float:
        """Seconds until `amount` is available (0 when it is now)."""
        self._refill(now_s)
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def take(self, amount: float, now_s: float) -> None:
        self._refill(now_s)
        self.level -= amount


@dataclass(frozen=True, slots=True)
class AuthDecision:
    key: ApiKey | None
    status: int | None = None  # 401 or 429 when refused
    message: str = ""
    retry_after_s: float = 0.0


class ApiKeyAuth:
    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = {key.sha256: key for key in keys}
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, known_tiers: set[str] | None = None) -> ApiKeyAuth:
        return cls(load_keys(path, known_tiers))

    def check(self, headers: Mapping[str, str], now_s: float) -> AuthDecision:
        presented = _presented_key(headers)
        key = self.keys.get(hash_key(presented)) if presented else None
        if key is None:
            # One message for missing and wrong keys: nothing to learn from trying.
            return AuthDecision(
                None, 401, "invalid or missing API key; send it as 'Authorization: Bearer <key>'"
            )
        with self._lock:
            waits = []
            if key.requests_per_minute is not None:
                bucket = self._requests.setdefault(
                    key.id, TokenBucket(key.requests_per_minute, now_s)
                )
                waits.append(bucket.wait_s(1, now_s))
            if key.tokens_per_minute is not None:
                bucket = self._tokens.setdefault(key.id, TokenBucket(key.tokens_per_minute, now_s))
                waits.append(
                    bucket.wait_s(0, now_s) if bucket.level > 0 else bucket.wait_s(1, now_s)
                )
            wait = max(waits, default=0.0)
            if wait > 0:
                return AuthDecision(
                    key,
                    429,
                    f"rate limit of API key '{key.id}' reached; retry after {math.ceil(wait)} s",
                    wait,
                )
            if key.requests_per_minute is not None:
                self._requests[key.id].take(1, now_s)
        return AuthDecision(key)

    def charge_tokens(self, key: ApiKey, tokens: int, now_s: float) -> None:
        if key.tokens_per_minute is None or tokens <= 0:
            return
        with self._lock:
            self._tokens.setdefault(key.id, TokenBucket(key.tokens_per_minute, now_s)).take(
                tokens, now_s
            )


class ApiKeyMiddleware:
    """Pure ASGI: every request to `routes` needs a valid key within its limits."""

    def __init__(
        self,
        app: ASGIApp,
        auth: ApiKeyAuth,
        spec: SLOSpec,
        routes: Iterable[str],
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        self.spec = spec
        self.routes = frozenset(routes)
        self.clock = clock or SystemClock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope.get("path", "")
        if scope["type"] != "http" or route not in self.routes:
            await self.app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
        }
        decision = self.auth.check(headers, self.clock.wall_s())
        key = decision.key
        state = request_state(scope)
        if key is not None:
            state["api_key_id"] = key.id
            tier = (
                self.spec.tier(key.tier)
                if key.tier is not None
                else self.spec.resolve_tier(headers, route, key.id)
            )
            state["tier"], state["priority"] = tier.name, tier.priority
            state["charge_tokens"] = self._charger(key)
        if decision.status is not None:
            await refusal(decision)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _charger(self, key: ApiKey) -> Any:
        def charge(tokens: int) -> None:
            self.auth.charge_tokens(key, tokens, self.clock.wall_s())

        return charge


def refusal(decision: AuthDecision) -> ASGIApp:
    """A tiny ASGI app answering 401 or 429 in OpenAI's error shape."""
    kind = "authentication_error" if decision.status == 401 else "rate_limit_error"
    body = json.dumps(
        {"error": {"message": decision.message, "type": kind, "param": None, "code": None}}
    ).encode()
    headers = [(b"content-type", b"application/json")]
    if decision.status == 429:
        headers.append((b"retry-after", str(max(1, math.ceil(decision.retry_after_s))).encode()))

    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": decision.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return respond


def _presented_key(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("x-api-key") or None


def load_keys(path: str | Path, known_tiers: set[str] | None = None) -> list[ApiKey]:
    source = str(path)
    try:
        raw: Any = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{source}: no such API-key file; "
            f"create one with `slo keys new --file {source} --id NAME`"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise UsageError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from None
    entries = (raw or {}).get("keys") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise UsageError(
            f"{source}: expected a mapping with a 'keys' list, "
            "e.g. keys: [{id: acme, sha256: ..., tier: premium}]"
        )
    keys: list[ApiKey] = []
    for index, entry in enumerate(entries):
        where = f"{source}: keys[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise UsageError(f"{where}: each key needs an 'id' (a name, not the key)")
        digest = entry.get("sha256")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest.lower())
        ):
            raise UsageError(
                f"{where} ('{entry['id']}'): 'sha256' must be the 64-hex SHA-256 of the key; "
                "`slo keys new` writes it"
            )
        tier = entry.get("tier")
        if tier is not None and known_tiers is not None and tier not in known_tiers:
            raise UsageError(
                f"{where} ('{entry['id']}'): tier '{tier}' is not in the spec; "
                f"use one of {', '.join(sorted(known_tiers))}"
            )
        limits = {}
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = entry.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise UsageError(f"{where} ('{entry['id']}'): '{name}' must be a positive number")
            limits[name] = None if value is None else float(value)
        keys.append(ApiKey(entry["id"], digest.lower(), tier, **limits))
    ids = [key.id for key in keys]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UsageError(f"{source}: key id '{duplicates[0]}' appears twice; ids must be unique")
    return keys
