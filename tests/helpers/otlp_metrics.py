"""Decoding OTLP/HTTP metric exports (`ExportMetricsServiceRequest`, protobuf or JSON) into
plain `ReceivedPoint`s, for the receiver in tests/helpers/standin_process.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedPoint:
    """One data point of one exported metric."""

    metric: str
    unit: str
    kind: str  # "histogram" | "sum" | "gauge"
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_schema_url: str
    temporality: int  # OTLP's enum: 1 delta, 2 cumulative (0 for gauges)
    count: int | None = None  # histograms
    total: float | None = None  # histograms: sum; sums and gauges: the value
    bucket_counts: tuple[int, ...] = ()
    explicit_bounds: tuple[float, ...] = ()


def _any_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _any_value(pair.value) for pair in pairs}


def decode_metrics(body: bytes, content_type: str) -> list[ReceivedPoint]:
    if content_type.startswith("application/json"):
        return _decode_json(json.loads(body))
    message = ExportMetricsServiceRequest()
    message.ParseFromString(body)
    points: list[ReceivedPoint] = []
    for resource_metrics in message.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                common = {"metric": metric.name, "unit": metric.unit, "kind": kind,
                          "resource": resource, "scope_schema_url": scope_metrics.schema_url,
                          "temporality": getattr(data, "aggregation_temporality", 0)}  # fmt: skip
                for point in data.data_points:
                    attributes = _attributes(point.attributes)
                    if kind == "histogram":
                        points.append(
                            ReceivedPoint(
                                **common,
                                attributes=attributes,
                                count=point.count,
                                total=point.sum,
                                bucket_counts=tuple(point.bucket_counts),
                                explicit_bounds=tuple(point.explicit_bounds),
                            )
                        )
                    else:
                        value = point.as_int if point.HasField("as_int") else point.as_double
                        points.append(ReceivedPoint(**common, attributes=attributes, total=value))
    return points


def _decode_json(document: dict[str, Any]) -> list[ReceivedPoint]:
    """OTLP/JSON (int64 as strings), for exporters configured with http/json."""

    def value(raw: dict[str, Any]) -> Any:
        for key, item in raw.items():
            return int(item) if key == "intValue" else item
        return None

    points: list[ReceivedPoint] = []
    for resource_metrics in document.get("resourceMetrics", []):
        resource = {a["key"]: value(a["value"]) for a in resource_metrics["resource"]["attributes"]}
        for scope_metrics in resource_metrics.get("scopeMetrics", []):
            for metric in scope_metrics.get("metrics", []):
                kind = next(k for k in ("histogram", "sum", "gauge") if k in metric)
                data = metric[kind]
                for point in data.get("dataPoints", []):
                    attributes = {a["key"]: value(a["value"]) for a in point.get("attributes", [])}
                    total = point.get("sum", point.get("asDouble", point.get("asInt")))
                    points.append(
                        ReceivedPoint(
                            metric=metric["name"],
                            unit=metric.get("unit", ""),
                            kind=kind,
                            attributes=attributes,
                            resource=resource,
                            scope_schema_url=scope_metrics.get("schemaUrl", ""),
                            temporality=int(data.get("aggregationTemporality", 0)),
                            count=int(point["count"]) if "count" in point else None,
                            total=float(total) if total is not None else None,
                            bucket_counts=tuple(int(c) for c in point.get("bucketCounts", [])),
                            explicit_bounds=tuple(point.get("explicitBounds", [])),
                        )
                    )
    return points
