"""`slo serve`: the bundled engine (or a checkpoint) behind the OpenAI-compatible API and the
middleware."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from slo.cli.common.flags import add_number_flag, check_at_least_one
from slo.cli.engine_flags import add_engine_flags, engine_overrides
from slo.cli.security import (
    add_security_flags,
    guard_operations,
    limit_addresses,
    read_access,
    scheme,
)
from slo.cli.serving import (
    add_server_flags,
    add_server_header_flag,
    check_positive_seconds,
    run_until_stopped,
)
from slo.errors import UsageError

if TYPE_CHECKING:
    from engine import Engine
    from middleware import LatencyMiddleware
    from middleware.types import ASGIApp

HELP = "serve a model over an OpenAI-compatible API"
DESCRIPTION = (
    "Start the bundled engine (or a Hugging Face-format checkpoint) behind an "
    "OpenAI-compatible HTTP API with uvicorn."
)


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_flags(parser)
    add_security_flags(parser)
    add_server_header_flag(parser)
    _add_model_flags(parser)
    add_engine_flags(parser)
    _add_api_flags(parser)
    _add_engine_config_flags(parser)
    parser.add_argument(
        "--provider-name",
        default="llm_slo",
        help="gen_ai.provider.name on the GenAI-convention spans and metrics "
        "(default: %(default)s)",
    )


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The model, what it runs on, and how many requests may wait for it."""
    parser.add_argument(
        "--model",
        default="bundled:tiny",
        help="'bundled:tiny' or a directory with config.json, *.safetensors and tokenizer.json",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto, float32 or bfloat16; bfloat16 is the fast one on CPUs with bf16 instructions "
        "(default: %(default)s)",
    )
    add_number_flag(
        parser,
        "--max-waiting",
        int,
        256,
        "requests allowed to wait for a batch slot before new ones get 429",
    )


def _add_api_flags(parser: argparse.ArgumentParser) -> None:
    """The API around the engine: when it gives a request up, and whether the middleware is
    there to measure it."""
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
        help="give up a request still waiting for its first token (queue wait + prefill) "
        "after this long",
    )
    parser.add_argument(
        "--no-middleware",
        action="store_true",
        help="serve the bare engine API, without latency middleware, /metrics or /slo",
    )


def _add_engine_config_flags(parser: argparse.ArgumentParser) -> None:
    """The engine's own switches (EngineConfig): the serving techniques, and a delay to drill
    the latency alerts with."""
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
    add_number_flag(parser, "--speculative-tokens", int, 4, "draft tokens proposed per step")
    parser.add_argument(
        "--quantization",
        choices=["int8", "int4"],
        default=None,
        help="weight-only int8 or int4 linear layers (real low-bit kernels; fewer bytes a token)",
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


def run(args: argparse.Namespace) -> int:
    step_delay_ms: float = args.step_delay_ms
    if step_delay_ms < 0:
        raise UsageError(f"--step-delay-ms must be >= 0, got {step_delay_ms}")
    check_at_least_one({"--speculative-tokens": args.speculative_tokens})
    request_timeout_s: float | None = args.request_timeout
    first_token_timeout_s: float | None = args.first_token_timeout
    shutdown_timeout_s: float = args.shutdown_timeout
    check_positive_seconds(
        {
            "--request-timeout": request_timeout_s,
            "--first-token-timeout": first_token_timeout_s,
            "--shutdown-timeout": shutdown_timeout_s,
        }
    )
    # Certificates, the token and the limits are checked before the engine spends its warm-up.
    context, token = read_access(args)
    if token is not None and args.no_middleware:
        raise UsageError(
            "--ops-token-file guards /metrics and /slo, which --no-middleware leaves out; "
            "drop one of the two"
        )
    from engine.api import Limits, create_app

    engine = _load_engine(args)
    engine.start_sync()  # load and warm up before accepting traffic; the cold start is reported
    limits = Limits(
        first_token_timeout_s=first_token_timeout_s, request_timeout_s=request_timeout_s
    )
    app: ASGIApp = limit_addresses(create_app(engine, limits=limits), args)
    close = _no_records
    middleware = None if args.no_middleware else _measured(app, engine, args)
    if middleware is not None:
        app, close = middleware, middleware.close
    app = guard_operations(app, middleware, token)
    host: str = args.host
    port: int = args.port
    where = f"{scheme(context)}://{host}:{port}"
    print(f"serving {engine.name} on {where} (OpenAI-compatible: /v1/...)")
    run_until_stopped(
        app,
        close,
        host=host,
        port=port,
        log_level=args.log_level,
        shutdown_timeout_s=shutdown_timeout_s,
        ssl_context=context,
        server_header=args.server_header,
    )
    return 0


def _measured(app: ASGIApp, engine: Engine, args: argparse.Namespace) -> LatencyMiddleware:
    """The latency middleware around `app`, fed by the engine's hooks."""
    from slo.cli.common.middleware import build_middleware

    middleware = build_middleware(app, args, model=engine.name, gpu_stats=engine.gpu_stats)
    engine.add_hooks(middleware.engine_hooks())
    if engine.cold_start is not None:
        middleware.observe_cold_start(engine.cold_start.total_s)
    return middleware


def _load_engine(args: argparse.Namespace) -> Engine:
    from engine import CheckpointError, Engine, EngineConfig

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
        **engine_overrides(args, args.spec),
    )
    model: str = args.model
    draft_model: str | None = args.draft_model
    try:
        return Engine.from_pretrained(model, config)
    except (CheckpointError, ValueError) as error:
        which = f"--model {model}" + (f" --draft-model {draft_model}" if draft_model else "")
        raise UsageError(f"{which}: {error}") from error


def _no_records() -> None:
    """Without the middleware there is nothing to flush."""
