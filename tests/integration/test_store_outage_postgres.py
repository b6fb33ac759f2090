"""PostgreSQL unreachable mid-run, then back: zero records lost, none stored twice.

The store talks to PostgreSQL through a loopback TCP proxy that the test takes down (every
connection cut, the port refusing) and brings back on the same port, as a network partition or
a database restart would look from the server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import make_url, text

from slo.store import TABLE, RecordStore
from tests.conftest import require_or_skip
from tests.helpers.polling import wait_until
from tests.helpers.record_samples import sample_records
from tests.helpers.servers import free_port

pytestmark = pytest.mark.integration


class TcpProxy:
    """127.0.0.1:port -> upstream, that can be taken down and brought back on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(); close alone leaves it listening.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def test_postgres_outage_spools_then_replays(tmp_path: Path) -> None:
    url = os.environ.get("LLM_SLO_POSTGRES_URL")
    if not url:
        require_or_skip("no PostgreSQL: set LLM_SLO_POSTGRES_URL (.ci/run starts one)")
    pytest.importorskip("psycopg")
    parsed = make_url(url)
    proxy = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432))
    proxy.start()
    run = uuid.uuid4().hex[:12]  # the table may be shared: count only this run's rows
    records = [r | {"request_id": f"{run}-{r['request_id']}"} for r in sample_records(230)]
    store = RecordStore(
        parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
        queue_size=50,
        batch_size=20,
        flush_interval_s=0.05,
        max_retry_s=0.3,
        spool_dir=tmp_path,
    )
    try:
        for record in records[:30]:
            store.add(record)
        store.flush()
        assert store.written == 30

        proxy.stop()  # unreachable: open connections cut, new ones refused
        for record in records[30:]:
            store.add(record)
        store.flush()  # returns during the outage, everything in the spool
        assert store.written == 30 and store.dropped == 0 and store.spooled == 200

        proxy.start()
        wait_until(lambda: store.replayed == 200, 30.0, "the spool to be replayed")
    finally:
        store.close()
        proxy.stop()
    assert (store.written, store.spooled, store.replayed, store.dropped) == (230, 200, 200, 0)
    assert list(tmp_path.glob("llm-slo-spool-*")) == []
    with RecordStore(url) as reader, reader.engine.connect() as connection:
        stored = connection.execute(
            text(f"SELECT request_id FROM {TABLE.name} WHERE request_id LIKE :run"),
            {"run": f"{run}-%"},
        ).scalars()
        assert sorted(stored) == sorted(r["request_id"] for r in records)  # none lost, none twice
        connection.execute(
            text(f"DELETE FROM {TABLE.name} WHERE request_id LIKE :run"), {"run": f"{run}-%"}
        )
        connection.commit()
