"""`slo proxy`: the latency middleware in front of any OpenAI-compatible server (a sidecar)."""

from __future__ import annotations

import argparse

from slo.cli.common.flags import (
    add_address_flag,
    add_number_flag,
    add_pem_flag,
    add_seconds_flag,
    check_at_least_one,
)
from slo.cli.proxy.app import build
from slo.cli.security import add_security_flags, read_access
from slo.cli.serving import add_server_flags, check_positive_seconds, run_until_stopped

HELP = "measure any OpenAI-compatible server: a streaming reverse proxy with the middleware"
DESCRIPTION = (
    "Forward every request to --upstream (any OpenAI-compatible server, in any "
    "language) with the latency middleware in front: records, /metrics and /slo as with "
    "`slo serve`, no change to the engine. Run it beside the engine (a sidecar)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8080"
    )
    add_server_flags(parser)
    parser.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="serve from N processes on the one port, so the proxy uses N cores; records, "
        "/metrics and /slo count every worker's requests; auto: the CPUs this process may "
        "use, at most the container's CPU limit. Size it to the pod's CPU limit "
        "(docs/proxy.md) (default: %(default)s)",
    )
    add_security_flags(parser)
    _add_upstream_tls_flags(parser)
    _add_upstream_flags(parser)
    _add_engine_telemetry_flags(parser)


def _add_upstream_flags(parser: argparse.ArgumentParser) -> None:
    """How the upstream is reached, how long it may take, and what its requests are labelled."""
    parser.add_argument(
        "--model",
        default="upstream",
        help="model label on metrics and records (default: %(default)s)",
    )
    add_number_flag(
        parser,
        "--max-connections",
        int,
        256,
        "most connections open to the upstream at once; more requests wait",
    )
    add_seconds_flag(
        parser,
        "--connect-timeout",
        5.0,
        "give up reaching the upstream (or waiting for a free connection): 504",
        metavar="SECONDS",
    )
    add_seconds_flag(
        parser,
        "--read-timeout",
        300.0,
        "give up when the upstream sends nothing for this long: 504",
        metavar="SECONDS",
    )
    parser.add_argument(
        "--inject-usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask streamed requests for usage (stream_options.include_usage) so token counts "
        "are exact on engines that report it; clients that did not ask never see it "
        "(default: on; --no-inject-usage for an engine that refuses stream_options, and the "
        "count is the token chunks)",
    )
    parser.add_argument(
        "--estimate-blame",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="estimate who made each request wait (queue behind requests in flight, slow "
        "token gaps beside other requests' prefill), by tier, in the records' delay_blame and "
        'llm_slo_delay_caused_seconds_total{estimated="true"} (default: on; docs/blame.md)',
    )


def _add_engine_telemetry_flags(parser: argparse.ArgumentParser) -> None:
    """What the proxy reads from the engine beside its replies: its metrics, its own request
    spans, its name."""
    parser.add_argument(
        "--upstream-metrics",
        default="auto",
        metavar="URL|auto|off",
        help="read the engine's Prometheus metrics (vLLM, SGLang, TGI, llama-server) into the "
        "engine gauges: queue depth, running, batch size, KV cache, preemptions; auto: "
        "<upstream>/metrics, once it answers (default: %(default)s)",
    )
    add_seconds_flag(
        parser, "--upstream-metrics-interval", 5.0, "how often to read them", metavar="SECONDS"
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="export this node's GPUs as `slo serve` does: utilization and memory per GPU "
        "through NVML (pynvml, from nvidia-ml-py), read at each scrape of /metrics; failed "
        "NVML calls are counted in llm_slo_gpu_telemetry_errors_total",
    )
    parser.add_argument(
        "--engine-spans",
        choices=("auto", "always", "never"),
        default="auto",
        help="join the engine's own request spans (OTLP/HTTP, POST /v1/traces on this port: "
        "vLLM, SGLang, TGI) to the records, for queue, prefill and decode: a finished request "
        "waits up to --engine-span-wait for its span; auto: once the engine has sent one "
        "(default: %(default)s)",
    )
    add_address_flag(
        parser,
        "--otlp-grpc",
        "also take the engine's spans as OTLP over gRPC (the TraceService, where vLLM and "
        "SGLang export by default and TGI always does) on this address, e.g. 0.0.0.0:4317; "
        "with the same join, the --ops-token-file token as 'authorization' metadata, and TLS "
        "when --ssl-certfile is given (default: OTLP/HTTP only)",
    )
    parser.add_argument(
        "--provider-name",
        default="auto",
        help="gen_ai.provider.name on the GenAI-convention spans and metrics; auto: the "
        "engine's name from its /v1/models owned_by (vllm, sglang, llama_cpp, ...), read once "
        "at startup with the models it lists (default: %(default)s)",
    )
    add_seconds_flag(
        parser,
        "--engine-span-wait",
        10.0,
        "how long a finished request waits for its engine span before it is recorded without "
        "it; above the engine's export delay (vLLM: 5 s)",
        metavar="SECONDS",
    )


def run(args: argparse.Namespace) -> int:
    from slo.cli.proxy.workers import check_shared_dir, resolve_workers, run_workers

    workers = resolve_workers(args.workers)
    check_flags(args)
    context, token = read_access(args)
    if workers > 1:
        check_shared_dir()
        # Everything a worker will build is built and checked here first (flags, TLS files,
        # spec, store, the upstream's listing): a mistake is one line before any worker starts.
        built = build(args, context, token, scrape=False)
        built.close()
        run_workers(args, built.listing, workers)
        return 0
    built = build(args, context, token)
    run_until_stopped(
        built.app,
        built.close,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        shutdown_timeout_s=args.shutdown_timeout,
        pass_through_headers=True,
        ssl_context=context,
    )
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """The numeric flags, checked before anything is read or started."""
    check_at_least_one({"--max-connections": args.max_connections})
    check_positive_seconds(
        {
            "--connect-timeout": args.connect_timeout,
            "--read-timeout": args.read_timeout,
            "--shutdown-timeout": args.shutdown_timeout,
            "--upstream-metrics-interval": args.upstream_metrics_interval,
            "--engine-span-wait": args.engine_span_wait,
        }
    )


def _add_upstream_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS to the upstream (an https:// --upstream)")
    add_pem_flag(
        group,
        "--upstream-ca-certs",
        "verify the upstream's certificate against these CAs (default: the system's)",
    )
    add_pem_flag(
        group, "--upstream-certfile", "present this client certificate to the upstream (mTLS)"
    )
    add_pem_flag(
        group, "--upstream-keyfile", "its private key (default: read from --upstream-certfile)"
    )
    group.add_argument(
        "--upstream-insecure",
        action="store_true",
        help="do not verify the upstream's certificate (anyone on the path can read and "
        "change the traffic); for a test bench only",
    )
