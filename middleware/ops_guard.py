"""The operations endpoints behind one bearer token: `/metrics`, `/slo`, `/slo.html` and the
OTLP intake `POST /v1/traces` tell whoever asks the tiers, the objectives, which customer
tier is burning and the request rates, so with a token set they answer only with it.

    app = OpsGuard(LatencyMiddleware(app, ...), token="...")   # `slo serve --ops-token-file`

A request carries it as `Authorization: Bearer <token>` (Prometheus' `authorization:
credentials_file:`, Alertmanager, curl, an OTLP exporter's headers). A browser has no such
header to send, so the page gets a login-free way: open `/slo.html?token=<token>` once; the
answer is a redirect to `/slo.html` (the token leaves the address bar and the history) that
sets a cookie, `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page can
make the browser send it), `Secure` over HTTPS, `Path=/`. The cookie holds an HMAC of the
token, not the token: it opens the GET endpoints (the page and the JSON it refreshes from,
`/metrics`), never the intake, and a leaked cookie does not give away the token that
Prometheus and the exporters use. Comparisons are constant-time (`hmac.compare_digest` on
SHA-256 digests, so the token's length does not show either).

Any other path passes through untouched; so does every non-HTTP scope (lifespan included).
The OTLP/gRPC intake (`middleware.intake.grpc_server`) checks the same token itself, in its
`authorization` metadata (`bearer_matches`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

from middleware.types import ASGIApp, Receive, Scope, Send

COOKIE = "llm_slo_ops"
COOKIE_MAX_AGE_S = 12 * 3600  # a shift: long enough for on-call, short enough to expire
DEFAULT_PATHS = ("/metrics", "/slo", "/slo.html", "/v1/traces")
_PAGE_QUERY = "token"


def token_digest(token: str) -> bytes:
    """What a presented token is compared with: its SHA-256, so its length does not show."""
    return hashlib.sha256(token.encode()).digest()


def bearer_matches(digest: bytes, authorization: str) -> bool:
    """Whether an `Authorization` value is `Bearer <the token of digest>` (constant-time);
    also the OTLP/gRPC intake's check of its `authorization` metadata."""
    if authorization[:7].lower() != "bearer ":
        return False
    presented = authorization[7:].strip().encode("utf-8", "replace")
    return hmac.compare_digest(hashlib.sha256(presented).digest(), digest)


class OpsGuard:
    """Pure ASGI: requests to `paths` need the ops token (header, or the page's cookie)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        paths: Iterable[str] = DEFAULT_PATHS,
        page_paths: Iterable[str] = ("/slo.html",),
        intake_paths: Iterable[str] = ("/v1/traces",),
    ) -> None:
        if not token:
            raise ValueError("the ops token is empty")
        self.app = app
        self.paths = frozenset(paths)
        self.page_paths = frozenset(page_paths)
        self.intake_paths = frozenset(intake_paths)
        self._digest = token_digest(token)
        self._cookie = hmac.new(token.encode(), b"llm-slo ops cookie", hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in self.paths:
            await self.app(scope, receive, send)
            return
        headers = [(k.lower(), v) for k, v in scope.get("headers", ())]
        if self._bearer_ok(headers) or self._cookie_ok(scope, path, headers):
            await self.app(scope, receive, send)
            return
        if path in self.page_paths and scope.get("method") == "GET":
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
            given = [value for name, value in query if name == _PAGE_QUERY]
            if given and self._matches(given[-1]):
                rest = [(name, value) for name, value in query if name != _PAGE_QUERY]
                await self._set_cookie_and_return(scope, send, path, rest)
                return
        await _unauthorized(send, path)

    def _matches(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode("utf-8", "replace")).digest()
        return hmac.compare_digest(digest, self._digest)

    def _bearer_ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return self._matches(value[7:].strip().decode("latin-1"))
        return False

    def _cookie_ok(self, scope: Scope, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        if path in self.intake_paths or scope.get("method") not in ("GET", "HEAD"):
            return False
        wanted = self._cookie.encode()
        for name, value in headers:
            if name != b"cookie":
                continue
            for part in value.split(b";"):
                key, _, presented = part.strip().partition(b"=")
                if key == COOKIE.encode() and hmac.compare_digest(presented, wanted):
                    return True
        return False

    async def _set_cookie_and_return(
        self, scope: Scope, send: Send, path: str, query: list[tuple[str, str]]
    ) -> None:
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = (
            f"{COOKIE}={self._cookie}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; "
            f"SameSite=Strict{secure}"
        )
        location = path + ("?" + urlencode(query) if query else "")
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("latin-1")),
                    (b"set-cookie", cookie.encode("latin-1")),
                    (b"cache-control", b"no-store"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})


async def _unauthorized(send: Send, path: str) -> None:
    message = f"{path} needs the operations token: send 'Authorization: Bearer <token>'" + (
        " or open /slo.html?token=<token> once" if path.startswith("/slo") else ""
    )
    body = json.dumps(
        {"error": {"message": message, "type": "authentication_error", "param": None, "code": None}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="llm-slo operations"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
