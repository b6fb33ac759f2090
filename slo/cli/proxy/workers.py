"""`slo proxy --workers N`: the same proxy in N processes on one port, counted as one.

uvicorn starts workers from an import string, so the parent hands each worker its parsed flags
(JSON in `ARGS_ENV`) and the upstream's listing it already read, and `create_app` builds the
same app in each. The parent has built and closed it once first: every mistake is one line
before a worker starts.

Counted as one: with `PROMETHEUS_MULTIPROC_DIR` set (a fresh private directory when the user
did not set one, removed at exit) `/metrics` adds up the workers' files and `/slo` every
worker's live windows (middleware.live.shared); every worker writes the same record store.
The engine's OTLP exporter keeps one connection, so its spans reach one worker while the
requests are spread over all: the span relay (middleware.intake.relay) hands a span to the
worker whose request it is. With `--otlp-grpc` every worker listens on that port too
(SO_REUSEPORT), and its spans are relayed the same way. One worker (the holder of a lock)
reads the engine's /metrics: its gauges are engine-wide, and N readers would count its queue
N times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn  # this module is imported only to run workers

from slo.cli.serving import DIRECT_BODY_PROTOCOL
from slo.errors import UsageError

if TYPE_CHECKING:
    from middleware.intake.relay import SpanRelay
    from middleware.types import Message, Receive, Scope, Send
    from slo.cli.proxy.app import Built

ARGS_ENV = "LLM_SLO_PROXY_WORKER_ARGS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LOSS_FLUSH_S = 1.0  # how often each worker brings its loss counters to /metrics


def resolve_workers(value: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """`--workers`: a count of at least 1, or `auto`: the CPUs this process may run on, at
    most the container's CPU quota (a pod's CPU limit) rounded down, at least 1."""
    if value == "auto":
        if hasattr(os, "sched_getaffinity"):  # Linux: the CPUs this process may run on
            cpus = len(os.sched_getaffinity(0))
        else:
            cpus = os.cpu_count() or 1
        quota = cpu_quota(cgroup_root)
        return max(1, min(cpus, int(quota))) if quota is not None else cpus
    try:
        workers = int(value)
    except ValueError:
        workers = 0
    if workers < 1:
        raise UsageError(f"--workers must be a whole number of at least 1 or auto, got {value!r}")
    return workers


def cpu_quota(root: Path) -> float | None:
    """The CPUs the cgroup's CFS quota allows (cgroup v2 `cpu.max`, or v1's
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None when there is none or none is readable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        allowed = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):  # "max" (v2) or -1 (v1): no quota
        return None
    return allowed if allowed > 0 else None


def check_shared_dir() -> Path | None:
    """The directory the user set for the workers' metrics, checked (it must exist, and be
    short enough for the relay's sockets); None when they set none."""
    from middleware.intake.relay import check_relay_dir, relay_dir

    if MULTIPROC_ENV not in os.environ:
        return None
    directory = Path(os.environ[MULTIPROC_ENV])
    if not directory.is_dir():
        raise UsageError(
            f"{MULTIPROC_ENV}={directory}: no such directory; create it (empty) or unset it "
            "and slo proxy makes a private one"
        )
    try:
        check_relay_dir(relay_dir(directory))
    except ValueError as error:
        raise UsageError(str(error)) from None
    return directory


def run_workers(args: argparse.Namespace, listing: tuple[str, list[str]], workers: int) -> None:
    """Serve the proxy from `workers` processes until SIGTERM or Ctrl-C."""
    directory = check_shared_dir()
    private = directory is None
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="llm-slo-proxy-"))
    os.environ[MULTIPROC_ENV] = str(directory)
    payload = {key: value for key, value in vars(args).items() if _is_json(value)}
    os.environ[ARGS_ENV] = json.dumps({"args": payload, "listing": listing})
    config = WorkerConfig(
        "slo.cli.proxy.workers:create_app",
        factory=True,
        workers=workers,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
        http=DIRECT_BODY_PROTOCOL,  # as one worker: httptools, stream pieces written directly
        server_header=False,
        date_header=False,
        proxy_headers=False,  # X-Forwarded-For only from --trusted-proxies (middleware.ip_limits)
    )
    try:
        try:
            socket = config.bind_socket()
        except SystemExit:  # uvicorn has logged why (the port is taken, the address is wrong)
            raise UsageError(
                f"--port {args.port}: cannot listen on {args.host}:{args.port}; "
                "pick a free port or stop what holds it"
            ) from None
        print(
            f"{workers} workers, counted as one (metrics and live windows in {directory})",
            flush=True,
        )
        _supervisor(config, socket).run()
    finally:
        if private:
            shutil.rmtree(directory, ignore_errors=True)


def _supervisor(config: uvicorn.Config, listening: Any) -> Any:
    """uvicorn's multiprocess supervisor (newer ones make each worker's server themselves)."""
    import inspect

    from uvicorn.supervisors import Multiprocess

    if "target" in inspect.signature(Multiprocess).parameters:
        return Multiprocess(config, target=uvicorn.Server(config).run, sockets=[listening])  # type: ignore[call-arg]
    return Multiprocess(config, sockets=[listening])


def _is_json(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, list))


class WorkerConfig(uvicorn.Config):
    """uvicorn builds its own TLS context from ssl_* options, with no minimum version: each
    worker serves with ours, made from the same flags (slo.cli.tls). Module-level, so the
    config pickles into the spawned workers."""

    def load(self) -> None:
        super().load()
        self.ssl = _worker_args_tls()


def _worker_args() -> tuple[argparse.Namespace, tuple[str, list[str]]]:
    payload = json.loads(os.environ[ARGS_ENV])
    provider, listed = payload["listing"]
    return argparse.Namespace(**payload["args"]), (provider, listed)


def _worker_args_tls() -> Any:
    from slo.cli.security import tls_context

    return tls_context(_worker_args()[0])


def create_app() -> WorkerApp:
    """uvicorn's factory in each worker: the proxy built from the parent's flags (already
    checked there, so what this prints would repeat the parent's lines: kept quiet)."""
    from middleware.intake.relay import SpanRelay, relay_dir
    from slo.cli.proxy.app import build
    from slo.cli.security import read_access

    args, listing = _worker_args()
    directory = relay_dir(Path(os.environ[MULTIPROC_ENV]))
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        context, token = read_access(args)
        scrape = _take_lock(directory / "upstream-metrics.lock")
        built = build(args, context, token, listing=listing, scrape=scrape, worker=True)
    return WorkerApp(built, SpanRelay(directory, built.middleware.span_join))


_held_locks: list[int] = []  # kept open for the worker's life: the kernel frees them at exit


def _take_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held_locks.append(fd)
    return True


class WorkerApp:
    """One worker's proxy: the relay listens and the loss counters reach the shared /metrics
    from lifespan startup to shutdown (`/metrics` brings only the answering worker's up)."""

    def __init__(self, built: Built, relay: SpanRelay) -> None:
        self.built = built
        self.relay = relay
        self.app = built.app
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.relay.start(asyncio.get_running_loop())
                self._flusher = asyncio.create_task(self._flush_losses())
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
            return message

        try:
            await self.app(scope, receive_wrapper, send)
        finally:
            await self._stop()
            await asyncio.to_thread(self.built.close)  # flushed once, whoever asks first
            self._observe_losses()  # the last counts: the spans that waited in vain at close

    async def _stop(self) -> None:
        self.relay.close()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None

    async def _flush_losses(self) -> None:
        while True:
            await asyncio.sleep(LOSS_FLUSH_S)
            self._observe_losses()

    def _observe_losses(self) -> None:
        middleware = self.built.middleware
        try:
            middleware.metrics.observe_losses(
                middleware.store, middleware.span_drops, middleware.span_join.counts
            )
        except Exception as error:  # a metrics file gone at exit must not hide the shutdown
            print(f"llm-slo: worker {os.getpid()}: loss counters: {error}", file=sys.stderr)
