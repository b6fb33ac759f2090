"""`MiddlewareConfig`: one frozen object of frozen parts at the middleware's door, checked where
it is made, and built from the CLI's flags in one place for `serve`, `proxy` and `demo`."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from pathlib import Path

import pytest

from middleware import (
    ConfigError,
    EngineSpansConfig,
    LatencyMiddleware,
    MiddlewareConfig,
    ReportingConfig,
    RoutesConfig,
)
from middleware.config import FIELD_PARTS
from slo.cli import build_parser
from slo.cli.common.middleware import FLAG_FIELDS, middleware_config

ROOT = Path(__file__).resolve().parents[3]


async def _no_app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("not called")


def test_the_door_takes_at_most_eight_parameters() -> None:
    parameters = inspect.signature(LatencyMiddleware.__init__).parameters
    assert len(parameters) <= 8, list(parameters)


def test_every_part_field_has_one_flat_name() -> None:
    for part in dataclasses.fields(MiddlewareConfig):
        for field in dataclasses.fields(getattr(MiddlewareConfig(), part.name)):
            assert FIELD_PARTS[field.name] == part.name


def test_of_puts_each_field_in_its_part_and_keeps_the_rest_default() -> None:
    config = MiddlewareConfig.of(inject_usage=True, wait_s=2.5, traces_path=None)
    assert config.reporting == ReportingConfig(inject_usage=True)
    assert config.engine_spans == EngineSpansConfig(wait_s=2.5)
    assert config.routes == RoutesConfig(traces_path=None)
    assert config.telemetry == MiddlewareConfig().telemetry
    assert config.replace(inject_usage=False).reporting == ReportingConfig()


def test_the_parts_are_frozen() -> None:
    config = MiddlewareConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.reporting.inject_usage = True  # type: ignore[misc]


def test_an_unknown_field_is_named_with_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"no field 'inject_usages'.*inject_usage"):
        MiddlewareConfig.of(inject_usages=True)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"wait_s": -1.0}, "engine_spans.wait_s"),
        ({"expect": "sometimes"}, "engine_spans.expect"),
        ({"report_delay_s": math.nan}, "reporting.report_delay_s"),
        ({"metrics_path": "metrics"}, "routes.metrics_path"),
        ({"llm_routes": ("/v1/chat/completions", "v1/completions")}, "routes.llm_routes"),
        ({"provider_name": ""}, "telemetry.provider_name"),
    ],
)
def test_a_bad_value_names_its_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        MiddlewareConfig.of(**fields)
    assert raised.value.field == named
    assert named in str(raised.value)


def test_the_middleware_reads_its_parts() -> None:
    config = MiddlewareConfig.of(
        llm_routes=["/generate"], metrics_path="/m", traces_path=None, propagate_trace=True
    )
    middleware = LatencyMiddleware(_no_app, store=None, config=config)
    assert "/generate" in middleware.llm_routes
    assert "/v1/completions" not in middleware.llm_routes
    assert (middleware.metrics_path, middleware.traces_path) == ("/m", None)
    assert middleware.propagate_trace is True
    assert not middleware.span_join.intake
    middleware.close()


def test_every_flag_sets_a_config_field() -> None:
    assert set(FLAG_FIELDS.values()) <= set(FIELD_PARTS)


def test_slo_proxy_flags_become_the_config() -> None:
    args = build_parser("proxy").parse_args(
        [
            "proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--inject-usage",
            "--engine-spans",
            "always",
            "--engine-span-wait",
            "3",
            "--alertmanager-url",
            "http://127.0.0.1:9093",
            "--provider-name",
            "vllm",
        ]
    )
    config = middleware_config(args, report_delay_s=0.001)
    assert config.reporting == ReportingConfig(
        inject_usage=True,
        report_delay_s=0.001,
        alertmanager_url="http://127.0.0.1:9093",
        estimate_blame=True,  # the proxy's default
    )
    assert config.engine_spans == EngineSpansConfig(expect="always", wait_s=3.0)
    assert config.telemetry.provider_name == "vllm"


def test_slo_proxy_asks_for_usage_unless_told_not_to() -> None:
    parser = build_parser("proxy")
    upstream = ["proxy", "--upstream", "http://127.0.0.1:1"]
    assert middleware_config(parser.parse_args(upstream)).reporting.inject_usage is True
    told = parser.parse_args([*upstream, "--no-inject-usage"])
    assert middleware_config(told).reporting.inject_usage is False


def test_slo_serve_flags_become_the_config(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    args = build_parser("serve").parse_args(["serve", "--api-keys", str(keys)])
    config = middleware_config(args)
    assert config.security.auth == str(keys)
    assert config.telemetry.provider_name == "llm_slo"
    assert config.reporting.inject_usage is False  # serve has no such flag: the default


def test_only_the_builder_makes_a_middleware_in_the_cli() -> None:
    makers = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "slo" / "cli").rglob("*.py")
        if re.search(r"\bLatencyMiddleware\(", path.read_text())
    ]
    assert makers == ["slo/cli/common/middleware.py"]
