"""Engine spans across the workers of one server: each span reaches the worker whose request
it is.

An engine's OTLP exporter keeps one connection, so all its spans reach one worker while the
requests are spread over all. Each worker has a tag (4 random bytes, 8 hex digits) and binds
a unix datagram socket `<tag>.sock` in the server's shared directory; the ids it mints for a
request carry the tag in front (`middleware.intake.propagate`): the trace id when the client
sent none, and the `X-Request-Id` sent upstream when the client sent none. A span this worker
cannot place (`SpanJoin.wanted`) whose trace id or request id begins with a live peer's tag is
read and sent to that peer, which places it exactly as its own: joined, held, a duplicate, or
counted unmatched there. A span no worker's tag names is counted unmatched where it arrived.
Each span is counted once, by one worker.

Whoever receives spans also tells every peer, at most once a second, that the engine exports
spans, so that each worker's reports wait for them (`expect="auto"`) as one worker's would.
A datagram that cannot be sent (the peer exited, its buffer is full) counts its spans as
unmatched here: spans are telemetry, and a worker's event loop never blocks on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from pathlib import Path

from middleware.intake import propagate
from middleware.intake.join import SpanJoin, request_keys
from middleware.upstream import SpanPhases

logger = logging.getLogger("middleware.intake")

RELAY_DIR_NAME = "llm_slo_relay"
SUFFIX = ".sock"
TAG_HEX = 8
MAX_DATAGRAM = 60_000  # bytes: well under Linux's default socket buffer (~208 KiB)
PEERS_TTL_S = 1.0  # the directory is listed again at most this often
SEEN_EVERY_S = 1.0
# sun_path is 108 bytes on Linux; a socket's path is the directory, a slash and the name.
MAX_PATH = 107


def relay_dir(shared: Path) -> Path:
    """Where the workers' relay sockets meet, under the server's shared directory."""
    return shared / RELAY_DIR_NAME


def check_relay_dir(directory: Path) -> None:
    """Raise ValueError naming the fix when a socket's path there would be too long."""
    longest = len(os.fsencode(directory)) + 1 + TAG_HEX + len(SUFFIX)
    if longest > MAX_PATH:
        raise ValueError(
            f"{directory}: socket paths there would be {longest} bytes (at most {MAX_PATH}); "
            "set PROMETHEUS_MULTIPROC_DIR to a shorter directory"
        )


class SpanRelay:
    """This worker's end of the relay, attached to its span join (`SpanJoin.relay`)."""

    def __init__(self, directory: Path, join: SpanJoin) -> None:
        self.directory = directory
        self.join = join
        self.tag = os.urandom(TAG_HEX // 2).hex()
        self.path = directory / f"{self.tag}{SUFFIX}"
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._peers: frozenset[str] = frozenset()
        self._peers_at = float("-inf")
        self._seen_sent_at = float("-inf")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen on this worker's socket (on `loop`, the one serving the requests) and tag
        the ids this process mints."""
        check_relay_dir(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.setblocking(False)
        receiver.bind(str(self.path))
        self._socket, self._loop = receiver, loop
        loop.add_reader(receiver.fileno(), self._receive)
        propagate.set_owner_tag(self.tag)
        self.join.relay = self

    def close(self) -> None:
        """Stop listening and leave the directory (spans for this worker are then unmatched
        where they arrive)."""
        if self._socket is None:
            return
        self.join.relay = None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._socket.fileno())
        self._socket.close()
        self._socket = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def owner(self, trace_id: str, request_id: str | None) -> str | None:
        """The live peer whose tag begins the span's trace id or request id; None when it is
        ours or no peer's."""
        for key in (trace_id, *request_keys(request_id)):
            tag = key[:TAG_HEX].lower()
            if tag != self.tag and tag in self._live_peers():
                return tag
        return None

    def forward(self, spans: list[SpanPhases]) -> None:
        """Send each span to its owner; one that cannot be sent is counted unmatched here."""
        by_owner: dict[str, list[SpanPhases]] = {}
        for span in spans:
            tag = self.owner(span.trace_id, span.request_id)
            if tag is None:
                self._unmatched(1)
            else:
                by_owner.setdefault(tag, []).append(span)
        for tag, owned in by_owner.items():
            for chunk in _datagrams([dataclasses.asdict(span) for span in owned]):
                if not self._send(tag, b'{"spans":' + chunk + b"}"):
                    self._unmatched(chunk.count(b'"trace_id"'))

    def saw_spans(self) -> None:
        """The engine exports spans: tell every peer, at most once a second."""
        now = time.monotonic()
        if now - self._seen_sent_at < SEEN_EVERY_S:
            return
        self._seen_sent_at = now
        for tag in self._live_peers():
            if tag != self.tag:
                self._send(tag, b'{"seen":true}')

    def _send(self, tag: str, datagram: bytes) -> bool:
        if self._socket is None:
            return False
        try:
            self._socket.sendto(datagram, str(self.directory / f"{tag}{SUFFIX}"))
        except OSError as error:  # gone, refused, or its buffer is full
            logger.warning("llm-slo: span relay to worker %s: %s", tag, error)
            self._peers_at = float("-inf")  # list the directory again next time
            return False
        return True

    def _receive(self) -> None:
        while self._socket is not None:
            try:
                datagram = self._socket.recv(1 << 18)
            except (BlockingIOError, InterruptedError):
                return
            try:
                message = json.loads(datagram)
                spans = [SpanPhases(**fields) for fields in message.get("spans", ())]
            except (ValueError, TypeError) as error:
                logger.warning("llm-slo: span relay: unreadable datagram: %s", error)
                continue
            self.join.note_spans_seen()
            wanted = [span for span in spans if self.join.wanted(span.trace_id, span.request_id)]
            if wanted:
                self.join.add(wanted, relayed=True)

    def _live_peers(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._peers_at >= PEERS_TTL_S:
            with contextlib.suppress(OSError):
                self._peers = frozenset(
                    name[: -len(SUFFIX)]
                    for name in os.listdir(self.directory)
                    if name.endswith(SUFFIX) and len(name) == TAG_HEX + len(SUFFIX)
                )
            self._peers_at = now
        return self._peers

    def _unmatched(self, count: int) -> None:
        self.join.counts.spans += count
        self.join.counts.unmatched += count


def _datagrams(spans: list[dict[str, object]]) -> list[bytes]:
    """JSON arrays of `spans`, each under MAX_DATAGRAM bytes."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 2
    for span in spans:
        encoded = json.dumps(span, separators=(",", ":")).encode()
        if current and size + len(encoded) + 1 > MAX_DATAGRAM:
            chunks.append(b"[" + b",".join(current) + b"]")
            current, size = [], 2
        current.append(encoded)
        size += len(encoded) + 1
    if current:
        chunks.append(b"[" + b",".join(current) + b"]")
    return chunks
