"""`slo generate --kubernetes`'s flags: the Deployment the sidecar joins, how the sidecar is
served (its operations token and TLS from Secrets), and the InferencePool of the tiers'
InferenceObjectives (docs/kubernetes.md)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from slo.errors import UsageError

if TYPE_CHECKING:
    from alerts.kubernetes import Workload

# A DNS-1123 label: Deployments, Services, Secrets and their keys' Secret names.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?=[-A-Za-z0-9_.]*$")


def add_kubernetes_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kubernetes/ (--kubernetes; docs/kubernetes.md)")
    group.add_argument(
        "--kubernetes",
        action="store_true",
        help="also write PrometheusRules, a ServiceMonitor and a PodMonitor, the dashboards as "
        "ConfigMaps, InferenceObjectives and the sidecar's Kustomize component",
    )
    group.add_argument("--deployment", default="llm-server", help="the engine's Deployment")
    group.add_argument("--namespace", default="default", help="the namespace of it all")
    group.add_argument(
        "--engine",
        choices=("vllm", "sglang", "other"),
        default="vllm",
        help="which engine flags point its spans at the proxy (other: the OTEL_* variables only)",
    )
    group.add_argument(
        "--engine-container", default="engine", help="the engine's container in the Deployment"
    )
    group.add_argument("--engine-port", type=int, default=8080, help="the engine's own port")
    group.add_argument("--proxy-port", type=int, default=8000, help="the sidecar's port")
    group.add_argument(
        "--proxy-image", default="ghcr.io/example/llm-slo:0.1.0", help="an image with llm-slo"
    )
    group.add_argument("--model", default=None, help="slo proxy --model (the model label)")
    group.add_argument(
        "--ops-token-secret",
        metavar="NAME/KEY",
        help="the Secret and key holding the operations token: the proxy reads it "
        "(--ops-token-file), the monitors send it, the engine's exporter sends it",
    )
    group.add_argument(
        "--tls-secret",
        metavar="NAME",
        help="serve the sidecar over TLS with this kubernetes.io/tls Secret (tls.crt, tls.key, "
        "and ca.crt that the monitors verify against)",
    )
    group.add_argument(
        "--inference-pool", default=None, help="the InferencePool (default: --deployment)"
    )
    group.add_argument(
        "--proxy-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument of the sidecar's `slo proxy`, e.g. "
        "--proxy-arg=--alertmanager-url=http://alertmanager:9093; repeat for each",
    )
    group.add_argument(
        "--monitor-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label on the rules and monitors, for Prometheus' selectors "
        "(e.g. release=kube-prometheus-stack); repeat for each",
    )


def _name(flag: str, value: str) -> str:
    if not _NAME.match(value):
        raise UsageError(
            f"{flag} {value!r}: expected a Kubernetes name (lowercase letters, digits, '-')"
        )
    return value


def _port(flag: str, value: int) -> int:
    if not 0 < value < 65536:
        raise UsageError(f"{flag} {value}: expected a port, 1 to 65535")
    return value


def _proxy_args(extra: list[str]) -> tuple[str, ...]:
    """The --proxy-arg values, checked by `slo proxy`'s own parser now rather than by a Pod
    that will not start."""
    from slo.cli.proxy.command import configure

    parser = argparse.ArgumentParser(
        prog="slo proxy", add_help=False, allow_abbrev=False, exit_on_error=False
    )
    configure(parser)
    try:
        _, unknown = parser.parse_known_args(["--upstream", "http://127.0.0.1:1", *extra])
    except argparse.ArgumentError as error:
        raise UsageError(f"--proxy-arg: slo proxy refuses it: {error}") from None
    if unknown:
        raise UsageError(f"--proxy-arg {unknown[0]!r}: not a flag of slo proxy (slo proxy -h)")
    return tuple(extra)


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The `alerts.kubernetes.Workload` the flags describe; bad values are one line."""
    from alerts.kubernetes import Workload

    token = None
    if args.ops_token_secret is not None:
        name, _, key = args.ops_token_secret.partition("/")
        if not _KEY.match(key):
            raise UsageError(
                f"--ops-token-secret {args.ops_token_secret!r}: expected NAME/KEY, "
                "e.g. llm-slo-ops/token"
            )
        token = (_name("--ops-token-secret", name), key)
    for label in args.monitor_label:
        if not _LABEL.match(label):
            raise UsageError(f"--monitor-label {label!r}: expected KEY=VALUE, e.g. release=prom")
    if args.engine_port == args.proxy_port:
        raise UsageError("--engine-port and --proxy-port must differ: both listen in one Pod")
    return Workload(
        deployment=_name("--deployment", args.deployment),
        namespace=_name("--namespace", args.namespace),
        engine=args.engine,
        engine_container=_name("--engine-container", args.engine_container),
        engine_port=_port("--engine-port", args.engine_port),
        port=_port("--proxy-port", args.proxy_port),
        image=args.proxy_image,
        model=args.model,
        ops_token_secret=token,
        tls_secret=None if args.tls_secret is None else _name("--tls-secret", args.tls_secret),
        inference_pool=None
        if args.inference_pool is None
        else _name("--inference-pool", args.inference_pool),
        labels=tuple((k, v) for k, _, v in (x.partition("=") for x in args.monitor_label)),
        proxy_args=_proxy_args(args.proxy_arg),
    )
