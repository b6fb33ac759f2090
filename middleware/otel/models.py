"""Bounded model labels: a model name becomes a metric attribute only from an allow-list.

The allow-list holds the configured models (`--model`, `LatencyMiddleware(models=...)`) and the
models the server or its upstream lists at `/v1/models` (read as the listing passes through
the middleware, and by `slo proxy` once at startup). Any other name counts as `other`, so a
client naming random models cannot grow the number of series. Spans carry the name as asked
(cut to MAX_NAME_CHARS): a span is one request, not a series.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import urllib.request
from collections.abc import Iterable
from typing import Any

from middleware.otel.conventions import FALLBACK_PROVIDER, OTHER_MODEL, PROVIDER_BY_OWNER
from middleware.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("middleware.otel")

# A listing may name more models than this; past it, the rest count as `other` (a listing is
# the server's word, but a series per name must stay bounded whatever it says).
MAX_LISTED_MODELS = 64
MAX_NAME_CHARS = 256
MAX_LISTING_BYTES = 1 << 20
MODELS_PATH = "/v1/models"


class ModelLabels:
    """The allow-list of model names that may become metric attributes."""

    def __init__(self, configured: Iterable[str] = ()) -> None:
        self._allowed = frozenset(name for name in configured if name)
        self._configured = len(self._allowed)
        self._lock = threading.Lock()

    @property
    def allowed(self) -> frozenset[str]:
        return self._allowed

    def label(self, name: str | None) -> str | None:
        """The metric attribute for a model name: itself when listed, `other` when not, None
        when no model was named."""
        if name is None:
            return None
        return name if name in self._allowed else OTHER_MODEL

    def allow(self, names: Iterable[str]) -> None:
        """Add listed names (up to MAX_LISTED_MODELS beyond the configured ones)."""
        with self._lock:
            allowed = set(self._allowed)
            for name in names:
                if len(allowed) >= self._configured + MAX_LISTED_MODELS:
                    break
                if isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS:
                    allowed.add(name)
            self._allowed = frozenset(allowed)  # readers never see a set being changed

    def learn(self, listing: bytes) -> str | None:
        """Allow the models of one `/v1/models` answer; the first model's `owned_by`."""
        ids, owner = read_listing(listing)
        self.allow(ids)
        return owner


def read_listing(listing: bytes) -> tuple[list[str], str | None]:
    """Model ids and the first `owned_by` of an OpenAI `/v1/models` body ([] on anything else)."""
    try:
        document: Any = json.loads(listing)
    except ValueError:
        return [], None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        return [], None
    models = [item for item in data if isinstance(item, dict)]
    ids = [item["id"] for item in models if isinstance(item.get("id"), str)]
    owners = [item["owned_by"] for item in models if isinstance(item.get("owned_by"), str)]
    return ids, owners[0] if owners else None


def provider_for_owner(owner: str | None) -> str:
    """`gen_ai.provider.name` for an engine that lists its models as owned by `owner`."""
    return PROVIDER_BY_OWNER.get((owner or "").lower(), FALLBACK_PROVIDER)


def fetch_listing(
    base_url: str, timeout_s: float = 2.0, context: ssl.SSLContext | None = None
) -> tuple[list[str], str | None]:
    """GET `<base_url>/v1/models` once: (model ids, first owned_by); ([], None) if it fails.
    `context`: the TLS context an https:// upstream is reached with (its CAs, client cert)."""
    url = base_url.rstrip("/") + MODELS_PATH
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as answer:
            return read_listing(answer.read(MAX_LISTING_BYTES))
    except (OSError, ValueError) as error:
        logger.info("llm-slo: %s did not list its models (%s); labels: configured only", url, error)
        return [], None


async def read_models_listing(
    app: ASGIApp, labels: ModelLabels, scope: Scope, receive: Receive, send: Send
) -> None:
    """Pass a `/v1/models` request to the app and allow the models its answer lists."""
    body = bytearray()
    status = 0

    async def send_and_read(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message.get("status", 0)
        elif message["type"] == "http.response.body" and len(body) < MAX_LISTING_BYTES:
            body.extend(message.get("body", b""))
            if not message.get("more_body", False) and status == 200:
                labels.learn(bytes(body))
        await send(message)

    await app(scope, receive, send_and_read)
