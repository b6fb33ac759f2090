"""What a `slo bench` run is given: its options, checked, and the server it runs against
(a URL, or `slo serve` started for the run); shared by the plain run and the capacity search."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slo.capacity.arrivals import ArrivalKind, check_arrival
from slo.errors import UsageError

if TYPE_CHECKING:  # httpx loads when a run starts, not when the CLI parser is built
    from slo.cli.bench.client import RequestSettings

# The context length assumed when neither --max-model-len nor the server says.
FALLBACK_CONTEXT = 4096


@dataclass
class BenchOptions:
    profile: str = "chat"
    requests: int = 100
    rate: float | None = None
    concurrency: int | None = None
    tier_mix: str | None = None
    tier_header: str = "x-llm-tier"
    seed: int = 0
    duration_limit_s: float = 600.0
    model: str | None = None
    max_model_len: int | None = None
    chars_per_token: float = 1.0
    stream: bool = True
    ignore_eos: bool = True
    request_timeout_s: float = 300.0
    progress: bool = True
    arrival: ArrivalKind = "poisson"
    burstiness: float = 1.0

    def check(self) -> None:
        problems = [
            (self.requests < 1, f"--requests must be >= 1, got {self.requests}"),
            (self.rate is not None and not self.rate > 0, f"--rate must be > 0, got {self.rate}"),
            (
                self.concurrency is not None and self.concurrency < 1,
                f"--concurrency must be >= 1, got {self.concurrency}",
            ),
            (
                not self.duration_limit_s > 0,
                f"--duration-limit must be > 0, got {self.duration_limit_s}",
            ),
            (
                not self.chars_per_token > 0,
                f"--chars-per-token must be > 0, got {self.chars_per_token}",
            ),
            (
                not self.request_timeout_s > 0,
                f"--request-timeout must be > 0, got {self.request_timeout_s}",
            ),
            (
                self.max_model_len is not None and self.max_model_len < 1,
                f"--max-model-len must be >= 1, got {self.max_model_len}",
            ),
        ]
        for failed, message in problems:
            if failed:
                raise UsageError(message)
        check_arrival(self.arrival, self.rate or 1.0, self.burstiness)

    def request_settings(self, model: str, endpoint: str) -> RequestSettings:
        """How each request is sent: alike in a plain run and in every step of a search."""
        from slo.cli.bench.client import RequestSettings

        return RequestSettings(
            model=model,
            endpoint=endpoint,
            stream=self.stream,
            ignore_eos=self.ignore_eos,
            tier_header=self.tier_header,
            seed=self.seed,
            timeout_s=self.request_timeout_s,
        )


@contextlib.contextmanager
def target(
    url: str | None,
    embedded: bool,
    model: str | None,
    spec: str | None,
    serve_args: tuple[str, ...] = (),
) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from slo.cli.bench.server import embedded_server

    print(
        f"slo bench: starting `slo serve --model {model or 'bundled:tiny'}` on 127.0.0.1 ...",
        flush=True,
    )
    with embedded_server(
        model=model or "bundled:tiny", spec=spec, extra_args=serve_args
    ) as base_url:
        yield base_url
