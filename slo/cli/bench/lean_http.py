"""A lean HTTP/1.1 client for `slo bench`'s open-loop sends over plain http://.

Why not httpx here: its connection pool (httpcore) scans every pooled connection, asking each
whether it has expired (a `getpeername` and a readability poll), on every request. At 200
requests/s that is tens of connections per request and ~9 ms of the client's CPU per request
on two cores: the schedule slips by a tenth of a second. This client keeps idle connections
in a list (take the last, give back to the end) with one spare opened ahead, so a send
writes its request (built as one `bytes`) in the same step of the event loop that starts
it; it reads the reply with asyncio streams: about half a millisecond a request.

It has the shape of the part of `httpx.AsyncClient` that `slo.cli.bench.client.measure`
uses (`stream("POST", url, json=..., headers=..., timeout=...)` yielding a response with
`status_code`, `headers.get`, `aread`, `aiter_bytes`), and raises httpx's exceptions, so the
measurement is the same code whichever client sends. https:// and injected transports stay
on httpx. Its timeout bounds the whole request, as `--request-timeout` says (httpx's bounds
each read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class LeanResponse:
    def __init__(self, status_code: int, headers: dict[str, str], reader: asyncio.StreamReader):
        self.status_code = status_code
        self.headers = headers
        self._reader = reader
        self.complete = False  # the whole body was read: the connection can serve another
        self.keep_alive = headers.get("connection", "").lower() != "close"

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        reader = self._reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                piece = await reader.readexactly(size + 2)
                yield piece[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                piece = await reader.read(min(left, 65536))
                if not piece:
                    raise httpx.RemoteProtocolError("the server closed the reply early")
                left -= len(piece)
                yield piece
        else:  # until the server closes
            self.keep_alive = False
            while piece := await reader.read(65536):
                yield piece
        self.complete = True

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_bytes()])


class LeanClient:
    """Keep-alive connections to one http:// origin, as many as requests in flight."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanClient serves http:// URLs, not {base_url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._host_header = parts.netloc.encode()
        self._idle: list[Connection] = []
        self._address: str | None = None  # the host resolved once (see `_connect`)
        self._spare: asyncio.Task[None] | None = None

    async def _open_spare(self) -> None:
        """One idle connection more, opened beside the sends: a send then writes at once
        instead of waiting for a TCP handshake on its schedule."""
        try:
            self._idle.append(await self._connect())
        except httpx.ConnectError:
            pass  # the send that needs it will say why
        finally:
            self._spare = None

    async def open(self) -> None:
        """Open the first connection before the schedule starts."""
        if not self._idle:
            await self._open_spare()

    async def _connect(self) -> Connection:
        """A new connection. The name is resolved on the first only, and the address that
        answered is kept: asyncio resolves a name in a thread (a millisecond or more on a busy
        machine), an address at once. Each address the name has is tried, as httpx does
        (`localhost` may be ::1 first for a server on 127.0.0.1 only)."""
        if self._address is not None:
            try:
                return await asyncio.open_connection(self._address, self._port)
            except OSError as error:
                raise httpx.ConnectError(f"{self._host}:{self._port}: {error}") from None
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                self._host, self._port, type=socket.SOCK_STREAM
            )
        except OSError as error:
            raise httpx.ConnectError(f"{self._host}: cannot resolve ({error})") from None
        failures = []
        for address in dict.fromkeys(str(entry[4][0]) for entry in found):
            try:
                connection = await asyncio.open_connection(address, self._port)
            except OSError as error:
                failures.append(f"{address}: {error.strerror or error}")
                continue
            self._address = address
            return connection
        raise httpx.ConnectError(f"{self._host}:{self._port}: {'; '.join(failures)}")

    def _request(self, url: str, body: Any, headers: dict[str, str]) -> bytes:
        path = urlsplit(url)
        target = (path.path or "/") + (f"?{path.query}" if path.query else "")
        payload = json.dumps(body, separators=(",", ":")).encode()
        lines = [
            f"POST {target} HTTP/1.1".encode(),
            b"Host: " + self._host_header,
            b"Content-Type: application/json",
            b"Accept: */*",
            b"Content-Length: " + str(len(payload)).encode(),
        ]
        lines += [f"{name}: {value}".encode() for name, value in headers.items()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + payload

    async def _exchange(self, request: bytes) -> tuple[Connection, LeanResponse]:
        """Send on an idle connection (a fresh one if the server had closed it) and read
        the reply's head."""
        while True:
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else await self._connect()
            if not self._idle and self._spare is None:  # the next send finds one ready
                self._spare = asyncio.create_task(self._open_spare())
            reader, writer = connection
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError) as error:
                writer.close()
                if reused:  # closed while idle: nothing was sent that the server read
                    continue
                raise httpx.RemoteProtocolError(f"no reply: {error!r}") from None
            except BaseException:  # a timeout or a cancelled run: this connection is done
                writer.close()
                raise
            try:
                return connection, _parse_head(head, reader)
            except httpx.RemoteProtocolError:
                writer.close()
                raise

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, url: str, *, json: Any, headers: dict[str, str], timeout: float
    ) -> AsyncIterator[LeanResponse]:
        if method != "POST":
            raise ValueError(f"LeanClient sends POST only, not {method}")
        request = self._request(url, json, headers)
        connection: Connection | None = None
        response: LeanResponse | None = None
        try:
            async with asyncio.timeout(timeout):
                connection, response = await self._exchange(request)
                yield response
        except TimeoutError:
            raise httpx.ReadTimeout(f"no complete reply within {timeout:g} s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            raise httpx.RemoteProtocolError(f"{type(error).__name__}: {error}") from None
        finally:
            if connection is not None:
                if response is not None and response.complete and response.keep_alive:
                    self._idle.append(connection)
                else:
                    connection[1].close()

    async def aclose(self) -> None:
        if self._spare is not None:
            self._spare.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spare
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def _parse_head(head: bytes, reader: asyncio.StreamReader) -> LeanResponse:
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return LeanResponse(int(parts[1]), headers, reader)
