"""SGLang's released observability code, loaded from its installed wheel on a CPU.

The wheel's `sglang/__init__.py` imports the whole server (CUDA kernels, transformers), so the
packages above `sglang/srt/observability/` are entered by path, without running it. What the
tracing modules import is SGLang's own where it imports on a CPU: `sglang.srt.environ` (its
`envs`), the enums `DisaggregationMode` and `ForwardMode` (compiled alone from the wheel's
`disaggregation/utils.py` and `model_executor/forward_batch_info.py`, whose other imports need
a GPU), and `utils/poll_timer.py`. Stood in for: `sglang.srt.runtime_context.get_resources`
(the trace level's holder), `sglang.srt.utils`' two environment readers, and the metrics
collectors' classes (only used with metrics on, which the engine here leaves off). Everything
in `trace.py`, `trace_async.py` and `req_time_stats.py` is the wheel's own code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, IntEnum, auto
from pathlib import Path
from typing import Any

from tests.helpers.engine_releases import SGLANG_VERSION

# The wheel's files this module reads (a copy of these is a wheel for `load` and `problems`).
FILES = (
    "srt/environ.py",
    "srt/observability/trace.py",
    "srt/observability/trace_async.py",
    "srt/observability/req_time_stats.py",
    "srt/observability/metrics_collector.py",
    "srt/utils/poll_timer.py",
    "srt/disaggregation/utils.py",
    "srt/model_executor/forward_batch_info.py",
)
PACKAGES = (
    "sglang",
    "sglang.srt",
    "sglang.srt.observability",
    "sglang.srt.disaggregation",
    "sglang.srt.model_executor",
)


class SglangMissing(RuntimeError):
    """The pinned SGLang wheel is not installed: the message says how to install it."""


def wheel_root() -> Path:
    """The installed wheel's `sglang/` folder; it must be the pinned release."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as error:
        raise SglangMissing(
            f"sglang is not installed: pip install --no-deps sglang=={SGLANG_VERSION}"
        ) from error
    if version != SGLANG_VERSION:
        raise SglangMissing(
            f"sglang {version} is installed, the tests pin {SGLANG_VERSION}: "
            f"pip install --no-deps sglang=={SGLANG_VERSION}"
        )
    # trace.py traces only when it imports both of the SDK's OTLP exporters.
    for exporter in ("grpc", "http"):
        if importlib.util.find_spec(f"opentelemetry.exporter.otlp.proto.{exporter}") is None:
            raise SglangMissing(
                f"SGLang's tracing needs opentelemetry-exporter-otlp-proto-{exporter} (dev extra)"
            )
    located = importlib.metadata.distribution("sglang").locate_file("sglang")
    return Path(str(located))


def _package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__package__ = name
    return module


def _classes_from(source: Path, names: tuple[str, ...], scope: dict[str, Any]) -> dict[str, Any]:
    """Compile only the named top-level classes of a wheel's module (its other imports need a
    GPU); `scope` gives the names they use."""
    tree = ast.parse(source.read_text(), str(source))
    body: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
    missing = set(names) - {getattr(node, "name", "") for node in body}
    if missing:
        raise SglangMissing(f"{source} defines no {sorted(missing)}")
    namespace = dict(scope)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec"), namespace)
    return {name: namespace[name] for name in names}


@dataclass
class _Resources:
    trace_level: int | None = None


def _stand_ins(root: Path) -> Iterator[types.ModuleType]:
    resources = _Resources()
    runtime = types.ModuleType("sglang.srt.runtime_context")
    runtime.get_resources = lambda: resources  # type: ignore[attr-defined]
    yield runtime
    utils = _package("sglang.srt.utils", root / "srt" / "utils")

    def get_int_env_var(name: str, default: int = 0) -> int:
        value = os.getenv(name, "").strip()
        return int(value) if value.lstrip("-").isdigit() else default

    def get_bool_env_var(name: str, default: str = "false") -> bool:
        return os.getenv(name, default).lower() in ("true", "1")

    utils.get_int_env_var = get_int_env_var  # type: ignore[attr-defined]
    utils.get_bool_env_var = get_bool_env_var  # type: ignore[attr-defined]
    yield utils
    disagg = types.ModuleType("sglang.srt.disaggregation.utils")
    disagg.__dict__.update(
        _classes_from(root / "srt/disaggregation/utils.py", ("DisaggregationMode",), {"Enum": Enum})
    )
    yield disagg
    forward = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    scope = {"IntEnum": IntEnum, "auto": auto}
    forward.__dict__.update(
        _classes_from(root / "srt/model_executor/forward_batch_info.py", ("ForwardMode",), scope)
    )
    yield forward
    collectors = types.ModuleType("sglang.srt.observability.metrics_collector")
    for name in ("SchedulerMetricsCollector", "TokenizerMetricsCollector"):
        setattr(collectors, name, type(name, (), {}))
    collectors.EncoderMetricsCollector = type("EncoderMetricsCollector", (), {})  # type: ignore[attr-defined]
    yield collectors


def load(root: Path | None = None) -> tuple[types.ModuleType, types.ModuleType]:
    """SGLang's `trace` and `req_time_stats` modules, from `root` (the installed wheel's
    `sglang/` by default, or a copy of it)."""
    root = wheel_root() if root is None else root
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    for name in PACKAGES:
        sys.modules[name] = _package(name, root.joinpath(*name.split(".")[1:]))
    for module in _stand_ins(root):
        sys.modules[module.__name__] = module
    trace = importlib.import_module("sglang.srt.observability.trace")
    stats = importlib.import_module("sglang.srt.observability.req_time_stats")
    return trace, stats


METRIC_KINDS = ("Counter", "Gauge", "Histogram", "Summary", "GaugeHistogram")


def metric_families(root: Path) -> set[str]:
    """The `/metrics` families metrics_collector.py defines, as prometheus_client's parser names
    them (a counter without its `_total`)."""
    path = root / "srt/observability/metrics_collector.py"
    families = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id not in METRIC_KINDS:
            continue
        for keyword in node.keywords:
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                name = str(keyword.value.value)
                families.add(name.removesuffix("_total") if node.func.id == "Counter" else name)
    return families


def stage_names(stats: types.ModuleType) -> set[str]:
    """The stage (span) names of req_time_stats.py's `RequestStage`."""
    configs = vars(stats.RequestStage).values()
    return {c.stage_name for c in configs if isinstance(c, stats.RequestStageConfig)}


def problems(root: Path, adapter: Any) -> list[str]:
    """What our SGLang adapter reads that this wheel does not have: its stage span names
    (`RequestStage`), request span attributes (`SpanAttributes`) and `/metrics` families."""
    trace, stats = load(root)
    stages = stage_names(stats)
    attributes = {v for k, v in vars(trace.SpanAttributes).items() if not k.startswith("_")}
    found = []
    for stage in sorted(set(adapter.stage_spans) - stages):
        found.append(f"stage span {stage!r} is no RequestStage of req_time_stats.py")
    for key in sorted(set(adapter.span_attributes.values()) - attributes):
        found.append(f"span attribute {key!r} is not in trace.py's SpanAttributes")
    for family in sorted(set(adapter.metrics) - metric_families(root)):
        found.append(f"/metrics family {family!r} is not defined in metrics_collector.py")
    return found
