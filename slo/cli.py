"""The `slo` command line: the front door that composes every package.

Each command imports what it needs inside its handler, so `import slo` stays light and never
imports torch. Bad input ends with one readable line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slo.errors import UsageError

Handler = Callable[[argparse.Namespace], int]


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API",
        description="Start the bundled engine (or a Hugging Face-format checkpoint) behind an "
        "OpenAI-compatible HTTP API with uvicorn.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        default="bundled:tiny",
        help="'bundled:tiny' or a directory with config.json, *.safetensors and tokenizer.json",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--dtype", default="auto", help="auto, float32 or bfloat16 (default: %(default)s)"
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests allowed to wait for a batch slot before new ones get 429 (default: %(default)s)",
    )
    parser.add_argument(
        "--spec", default=None, help="SLO spec YAML (default: the packaged example spec)"
    )
    parser.add_argument(
        "--store",
        default="sqlite:///slo-records.db",
        help="where request records go: sqlite:///FILE or postgresql://... (default: %(default)s)",
    )
    parser.add_argument(
        "--alertmanager-url",
        default=None,
        help="push alerts the live SLO evaluator fires to this Alertmanager (e.g. http://127.0.0.1:9093)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up a request after this long: 504, outcome timeout (default: no limit)",
    )
    parser.add_argument(
        "--first-token-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up a request still waiting for its first token (queue wait + prefill) after this long",
    )
    parser.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help="require API keys from this YAML file (hashed; per-key tier and rate limits); "
        "`slo keys new` writes it",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, stop accepting and give in-flight requests this long to finish before "
        "they are cut; every record is flushed either way (default: %(default)s)",
    )
    parser.add_argument(
        "--no-middleware",
        action="store_true",
        help="serve the bare engine API, without latency middleware, /metrics or /slo",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="share the KV blocks of common prompt prefixes between requests",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding with this draft model (e.g. bundled:small-draft)",
    )
    parser.add_argument(
        "--speculative-tokens",
        type=int,
        default=4,
        help="draft tokens proposed per step (default: 4)",
    )
    parser.add_argument(
        "--quantization", choices=["int8"], default=None, help="INT8 weight-only linear layers"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode forward during warm-up: faster decode steps after a "
        "one-time compile (tens of seconds on a CPU, then cached on disk)",
    )
    parser.add_argument(
        "--step-delay-ms",
        type=float,
        default=0.0,
        help="slow every engine step down by this much, to drill latency alerts (default: 0)",
    )
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import signal

    import uvicorn

    from engine import CheckpointError, Engine, EngineConfig
    from engine.api import Limits, create_app

    if args.step_delay_ms < 0:
        raise UsageError(f"--step-delay-ms must be >= 0, got {args.step_delay_ms}")
    if args.speculative_tokens < 1:
        raise UsageError(f"--speculative-tokens must be at least 1, got {args.speculative_tokens}")
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        max_waiting=args.max_waiting,
        step_delay_s=args.step_delay_ms / 1000,
        enable_prefix_caching=args.enable_prefix_caching,
        draft_model=args.draft_model,
        num_speculative_tokens=args.speculative_tokens,
        quantization=args.quantization,
        compile=args.compile,
    )
    try:
        engine = Engine.from_pretrained(args.model, config)
    except (CheckpointError, ValueError) as error:
        which = f"--model {args.model}" + (
            f" --draft-model {args.draft_model}" if args.draft_model else ""
        )
        raise UsageError(f"{which}: {error}") from error
    engine.start_sync()  # load and warm up before accepting traffic; the cold start is reported
    for flag, value in (
        ("--request-timeout", args.request_timeout),
        ("--first-token-timeout", args.first_token_timeout),
        ("--shutdown-timeout", args.shutdown_timeout),
    ):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be a positive number of seconds, got {value}")
    limits = Limits(
        first_token_timeout_s=args.first_token_timeout, request_timeout_s=args.request_timeout
    )
    app: Any = create_app(engine, limits=limits)
    middleware = None
    if not args.no_middleware:
        from middleware import LatencyMiddleware

        middleware = LatencyMiddleware(
            app,
            spec=args.spec,
            store=args.store,
            model=engine.name,
            gpu_stats=engine.gpu_stats,
            alertmanager_url=args.alertmanager_url,
            auth=args.api_keys,
        )
        engine.add_hooks(middleware.engine_hooks())
        if engine.cold_start is not None:
            middleware.observe_cold_start(engine.cold_start.total_s)
        app = middleware
    print(f"serving {engine.name} on http://{args.host}:{args.port} (OpenAI-compatible: /v1/...)")
    # uvicorn drains on SIGTERM (stops accepting, lets in-flight requests finish), then raises
    # the signal again for the handler it found. With the default handler that kills the
    # process before the records are flushed; this one exits through `finally` instead.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.shutdown_timeout,
        )
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the flush
        if middleware is not None:
            middleware.close()
    return 0


def _exit_cleanly(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def _add_proxy(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "proxy",
        help="measure any OpenAI-compatible server: a streaming reverse proxy with the middleware",
        description="Forward every request to --upstream (any OpenAI-compatible server, in any "
        "language) with the latency middleware in front: records, /metrics and /slo as with "
        "`slo serve`, no change to the engine. Run it beside the engine (a sidecar).",
    )
    parser.add_argument(
        "--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        default="upstream",
        help="model label on metrics and records (default: %(default)s)",
    )
    parser.add_argument(
        "--spec", default=None, help="SLO spec YAML (default: the packaged example spec)"
    )
    parser.add_argument(
        "--store",
        default="sqlite:///slo-records.db",
        help="where request records go: sqlite:///FILE or postgresql://... (default: %(default)s)",
    )
    parser.add_argument(
        "--alertmanager-url",
        default=None,
        help="push alerts the live SLO evaluator fires to this Alertmanager",
    )
    parser.add_argument(
        "--api-keys", default=None, metavar="FILE", help="require API keys from this YAML file"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="most connections open to the upstream at once; more requests wait (default: %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up reaching the upstream (or waiting for a free connection): 504 (default: %(default)s)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up when the upstream sends nothing for this long: 504 (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, give in-flight requests this long to finish (default: %(default)s)",
    )
    parser.add_argument(
        "--inject-usage",
        action="store_true",
        help="ask streamed requests for usage (stream_options.include_usage) so token counts "
        "are exact on engines that report it; clients that did not ask never see it",
    )
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )
    parser.set_defaults(handler=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    import signal

    import uvicorn

    from middleware import LatencyMiddleware
    from middleware.proxy import ProxyApp

    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {args.max_connections}")
    for flag, value in (
        ("--connect-timeout", args.connect_timeout),
        ("--read-timeout", args.read_timeout),
        ("--shutdown-timeout", args.shutdown_timeout),
    ):
        if value <= 0:
            raise UsageError(f"{flag} must be a positive number of seconds, got {value}")
    try:
        proxy = ProxyApp(
            args.upstream,
            max_connections=args.max_connections,
            connect_timeout_s=args.connect_timeout,
            read_timeout_s=args.read_timeout,
        )
    except ValueError as error:
        raise UsageError(f"--upstream: {error}") from error
    middleware = LatencyMiddleware(
        proxy,
        spec=args.spec,
        store=args.store,
        model=args.model,
        alertmanager_url=args.alertmanager_url,
        auth=args.api_keys,
        inject_usage=args.inject_usage,
    )
    print(f"proxying http://{args.host}:{args.port} -> {proxy.upstream_url} (model {args.model})")
    signal.signal(signal.SIGTERM, _exit_cleanly)  # flush records on SIGTERM (see _serve)
    try:
        uvicorn.run(
            middleware,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.shutdown_timeout,
            # The C parser (and uvloop where installed) keeps the proxy's cost per chunk low;
            # the upstream's own Server and Date headers pass through instead of ours.
            http="httptools",
            server_header=False,
            date_header=False,
        )
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        middleware.close()
    return 0


def _add_check(subparsers: argparse._SubParsersAction) -> None:
    from slo.check import configure

    parser = subparsers.add_parser(
        "check",
        help="judge records or Prometheus against the SLO spec; exit 1 on a violation",
        description="Evaluate every tier's objectives over a run's records (--results), a record "
        "store (--db) or Prometheus (--prometheus). Exit 0 when all are met, 1 when any is "
        "violated (or lacks data, with --strict), 2 on bad input.",
    )
    configure(parser)
    parser.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from slo.check import run

    return run(args)


def _add_lint(subparsers: argparse._SubParsersAction) -> None:
    from slo.lint import configure_lint

    parser = subparsers.add_parser(
        "lint",
        help="validate an SLO spec and print it normalized",
        description="Validate an SLO spec (ours or OpenSLO v1) and print it normalized.",
    )
    configure_lint(parser)
    parser.set_defaults(handler=_lint)


def _lint(args: argparse.Namespace) -> int:
    from slo.lint import run_lint

    return run_lint(args)


def _add_init(subparsers: argparse._SubParsersAction) -> None:
    from slo.lint import configure_init

    parser = subparsers.add_parser(
        "init",
        help="write the example SLO spec to start from",
        description="Copy the packaged example spec (three tiers) to a file you can edit.",
    )
    configure_init(parser)
    parser.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    from slo.lint import run_init

    return run_init(args)


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="write Grafana dashboards, Prometheus rules and tests, Alertmanager config, runbooks",
        description="Render, from one SLO spec, grafana/*.json (+ provisioning), "
        "prometheus/rules.yml and its promtool tests prometheus/rules_test.yml, "
        "alertmanager/alertmanager.yml and runbooks/*.md under --out.",
    )
    parser.add_argument("--spec", help="SLO spec (default: the packaged example)")
    parser.add_argument("--out", required=True, help="directory to write into (created)")
    parser.add_argument(
        "--webhook-url",
        default="http://127.0.0.1:5001/llm-slo/alerts",
        help="URL every Alertmanager receiver posts to (default: %(default)s)",
    )
    parser.add_argument(
        "--runbook-url",
        default="https://runbooks.example.com/llm-slo",
        help="base URL of the published runbooks/ (default: %(default)s)",
    )
    parser.add_argument(
        "--grafana-url",
        default="http://localhost:3000",
        help="Grafana base URL for the alerts' dashboard links (default: %(default)s)",
    )
    parser.add_argument(
        "--prometheus-url",
        default="http://localhost:9090",
        help="Prometheus URL for the Grafana datasource (default: %(default)s)",
    )
    parser.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from alerts import Links, write_alerts
    from dashboards import OVERVIEW_UID, write_dashboards
    from slo.alert_rules import unbucketed_thresholds, unreachable
    from slo.spec import SLOSpec

    spec = SLOSpec.load(args.spec) if args.spec else SLOSpec.default()
    problems = unbucketed_thresholds(spec)
    if problems:
        raise UsageError(problems[0])
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot create the directory ({error})") from None
    links = Links(args.runbook_url, f"{args.grafana_url.rstrip('/')}/d/{OVERVIEW_UID}")
    written = write_alerts(spec, out, links, args.webhook_url)
    written += write_dashboards(spec, out, args.prometheus_url)
    for note in unreachable(spec):
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {len(written)} files under {out}")
    for path in sorted(written):
        print(f"  {path.relative_to(out)}")
    return 0


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    from slo.bench.command import configure

    parser = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint; client and server timings per request",
        description="Send a seeded, profiled stream of requests (Poisson arrivals or a fixed "
        "concurrency, tiers mixed by header) to any OpenAI-compatible server and write one JSONL "
        "record per request: the client's TTFT, ITL, TPOT and e2e next to the server's own "
        "timings. `slo check --results` and `slo report` read the file.",
    )
    configure(parser)
    parser.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    from slo.bench.command import run

    return run(args)


def _add_report(subparsers: argparse._SubParsersAction) -> None:
    from slo.report import configure

    parser = subparsers.add_parser(
        "report",
        help="draw a run's records as one self-contained HTML report",
        description="Verdicts per tier, percentiles against the SLO lines, where the time went, "
        "CDFs, TTFT against input length, latency over the run and the industry performance "
        "tier, in one HTML file that works offline. Needs `pip install 'llm-slo[report]'`.",
    )
    configure(parser)
    parser.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    from slo.report import run

    return run(args)


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    from slo.demo import configure

    parser = subparsers.add_parser(
        "demo",
        help="the one-command tour: serve, benchmark, judge, report, generate (under a minute)",
        description="Start the bundled engine behind the latency middleware on 127.0.0.1, run a "
        "short mixed-tier benchmark, print the per-tier breakdown and SLO verdicts, and write "
        "the records, report.html and everything `slo generate` writes into --out.",
    )
    configure(parser)
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from slo.demo import run

    # `slo generate` lives in alerts/ and dashboards/, which only this module may import.
    return run(args, generate=lambda spec, out: main(["generate", "--spec", spec, "--out", out]))


def _add_keys(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="manage API keys (stored hashed)",
        description="Manage the API-key file that `slo serve --api-keys` reads.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    new = actions.add_parser("new", help="create a key, store its hash, print the key once")
    new.add_argument("--file", required=True, help="the key file (created if missing)")
    new.add_argument("--id", required=True, help="a name for the key, e.g. acme-prod")
    new.add_argument("--tier", default=None, help="the tier this key's requests belong to")
    new.add_argument("--requests-per-minute", type=float, default=None)
    new.add_argument("--tokens-per-minute", type=float, default=None)
    new.set_defaults(handler=_keys_new)


def _keys_new(args: argparse.Namespace) -> int:
    from dataclasses import asdict
    from pathlib import Path

    import yaml

    from middleware.auth import hash_key, load_keys, new_key

    path = Path(args.file)
    entries = (
        []
        if not path.exists()
        else [{k: v for k, v in asdict(key).items() if v is not None} for key in load_keys(path)]
    )
    if any(entry["id"] == args.id for entry in entries):
        raise UsageError(f"{path}: a key with id '{args.id}' already exists; pick another --id")
    for flag, value in (
        ("--requests-per-minute", args.requests_per_minute),
        ("--tokens-per-minute", args.tokens_per_minute),
    ):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    key = new_key()
    entry = {
        "id": args.id,
        "sha256": hash_key(key),
        "tier": args.tier,
        "requests_per_minute": args.requests_per_minute,
        "tokens_per_minute": args.tokens_per_minute,
    }
    entries.append({k: v for k, v in entry.items() if v is not None})
    path.write_text(yaml.safe_dump({"keys": entries}, sort_keys=False))
    print(key)
    print(
        f"stored the hash of key '{args.id}' in {path}; the key itself is shown only now",
        file=sys.stderr,
    )
    return 0


def _add_compare(subparsers: argparse._SubParsersAction) -> None:
    from slo.compare import VARIANTS

    parser = subparsers.add_parser(
        "compare",
        help="measure what INT8, prefix caching, speculative decoding and batching buy",
        description="Run the same seeded workload against the embedded engine once per "
        "variant and print TTFT, TPOT, throughput, CPU cost per 1k tokens and greedy agreement "
        "as ratios to the baseline, next to the industry comparison matrix's claimed ranges. "
        "Writes an HTML report with a chart.",
    )
    parser.add_argument("--profile", default="chat", help="traffic profile (default: %(default)s)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, from " + ",".join(VARIANTS) + " (default: all)",
    )
    parser.add_argument("--requests", type=int, default=16, help="requests per variant")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument(
        "--model", default="bundled:small", help="target model (default: %(default)s)"
    )
    parser.add_argument(
        "--draft-model",
        default="bundled:small-draft",
        help="draft for the speculative variant (default: %(default)s)",
    )
    parser.add_argument("--speculative-tokens", type=int, default=4, help="draft tokens per step")
    parser.add_argument(
        "--context",
        type=int,
        default=512,
        help="shrink the profile's lengths to fit this many tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--shared-prefix-chars",
        type=int,
        default=256,
        help="a system prompt this long opens every prompt, as in chat (default: %(default)s)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument(
        "--rate",
        type=float,
        default=16.0,
        help="Poisson arrivals per second; 16 keeps a CPU engine busy, where the profile's own "
        "rate would leave it idle and every throughput equal (0 sends all at once; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per variant, interleaved, medians kept: steadier on a shared machine "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 keeps runs steady on a shared machine (default: %(default)s)",
    )
    parser.add_argument(
        "--report",
        default="slo-compare.html",
        help="HTML report with the matrix and chart (default: %(default)s)",
    )
    parser.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from slo.bench.profiles import get_profile, plan_requests
    from slo.compare import parse_variants, render_html, shared_prefix

    variants = parse_variants(args.variants)
    if args.requests < 1:
        raise UsageError(f"--requests must be at least 1, got {args.requests}")
    profile = get_profile(args.profile)
    planned = plan_requests(
        profile,
        args.requests,
        seed=args.seed,
        max_model_len=args.context,
        rate=_compare_rate(args.rate, profile),
    )
    try:
        from engine.compare import WorkItem, run_variant
    except ImportError as error:
        raise UsageError(
            f"slo compare runs the bundled engine: pip install 'llm-slo[engine]' ({error})"
        ) from None
    prefix = shared_prefix(args.shared_prefix_chars)
    work = [WorkItem(prefix + p.prompt, p.max_tokens, p.offset_s) for p in planned]
    print(
        f"slo compare: {len(work)} {profile.name} requests per variant, model {args.model}, "
        f"variants {','.join(variants)}",
        flush=True,
    )
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    runs: dict[str, list[Any]] = {variant: [] for variant in variants}
    for repeat in range(args.repeats):
        for variant in variants:  # interleaved, so a noisy minute hits every variant alike
            run = run_variant(
                args.model,
                variant,
                work,
                draft_model=args.draft_model,
                num_speculative_tokens=args.speculative_tokens,
                device=args.device,
                seed=args.seed,
                threads=args.threads,
            )
            print(
                f"  run {repeat + 1}/{args.repeats} {variant:<13} {run.wall_s:5.1f}s  "
                f"{run.output_tokens} tokens",
                flush=True,
            )
            runs[variant].append(run)
    baseline = runs["baseline"][0]
    measurements = [
        _median_measurement([_measurement(r, baseline) for r in runs[v]]) for v in variants
    ]
    from slo.compare import format_matrix

    print()
    print(format_matrix(measurements))
    report = Path(args.report)
    report.write_text(render_html(measurements, f"slo compare: {profile.name}, {args.model}"))
    print(f"\nreport: {report}")
    return 0


def _median_measurement(repeats: list[Any]) -> Any:
    """Each number the median over the repeats of one variant."""
    from dataclasses import replace
    from statistics import median

    def middle(name: str) -> Any:
        values = [getattr(m, name) for m in repeats]
        return None if values[0] is None else median(values)

    numbers = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "cpu_s_per_1k_tokens", "wall_s",
               "agreement", "acceptance_rate", "prefix_hit_rate")  # fmt: skip
    return replace(repeats[0], **{name: middle(name) for name in numbers})


def _compare_rate(rate: float | None, profile: Any) -> float | None:
    """Arrival rate for the plan: None sends everything at once (closed loop)."""
    if rate is None:
        return profile.rate if profile.arrival == "poisson" else None
    if rate < 0:
        raise UsageError(f"--rate must be >= 0, got {rate}")
    return rate or None


def _measurement(run: Any, baseline: Any) -> Any:
    """An engine run (engine.compare.VariantRun) as the pure record slo.compare formats."""
    from statistics import median

    from slo.compare import Measurement

    tokens = max(run.output_tokens, 1)
    agree = sum(
        next(
            (i for i, (a, b) in enumerate(zip(mine, base, strict=False)) if a != b),
            min(len(mine), len(base)),
        )
        for mine, base in zip(run.token_ids, baseline.token_ids, strict=True)
    )
    totals = run.totals
    return Measurement(
        variant=run.variant,
        requests=len(run.token_ids),
        output_tokens=run.output_tokens,
        ttft_p50_s=median(run.ttft_s),
        tpot_p50_s=median(run.tpot_s) if run.tpot_s else 0.0,
        throughput_tok_s=run.output_tokens / run.wall_s if run.wall_s > 0 else 0.0,
        cpu_s_per_1k_tokens=run.cpu_s / tokens * 1000,
        wall_s=run.wall_s,
        agreement=agree / max(baseline.output_tokens, 1),
        acceptance_rate=(
            totals.spec_accepted_tokens / totals.spec_draft_tokens
            if totals.spec_draft_tokens
            else None
        ),
        prefix_hit_rate=(
            totals.prefix_cache_hit_tokens / totals.prefix_cache_queried_tokens
            if totals.prefix_cache_queried_tokens
            else None
        ),
    )


_COMMAND_BUILDERS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_serve,
    _add_proxy,
    _add_keys,
    _add_check,
    _add_lint,
    _add_init,
    _add_generate,
    _add_bench,
    _add_report,
    _add_demo,
    _add_compare,
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `command` only that command's (building a command's parser
    imports its module: `slo check` need not load `slo bench`'s HTTP client)."""
    from slo import __version__

    parser = argparse.ArgumentParser(
        prog="slo",
        description="Latency observability and SLOs for LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"llm-slo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add_command in _COMMAND_BUILDERS:
        if command is None or add_command.__name__ == f"_add_{command}":
            add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = {add_command.__name__.removeprefix("_add_") for add_command in _COMMAND_BUILDERS}
    parser = build_parser(argv[0] if argv and argv[0] in names else None)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"slo {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
