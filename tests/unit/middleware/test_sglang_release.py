"""Our SGLang adapter against SGLang's released code (the wheel pinned in
tests/helpers/engine_releases.py): every stage span name, span attribute and `/metrics` family
it reads is in the wheel, and a rename in the wheel fails the contract test, naming it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.upstream.engines.sglang import SGLANG
from tests.helpers.engine_releases import NO_DEPS_WHEELS, SGLANG_VERSION
from tests.helpers.sglang_release import (
    FILES,
    SglangMissing,
    load,
    metric_families,
    problems,
    stage_names,
    wheel_root,
)
from tests.helpers.standin_metrics import SglangMetrics
from tests.helpers.standin_telemetry import Timeline, _sglang_scheduler_spans

# A copy of the wheel's files to check instead of the installed wheel (the mutation test's).
COPY_ENV = "LLM_SLO_SGLANG_WHEEL_COPY"


def wheel() -> Path:
    copy = os.environ.get(COPY_ENV)
    if copy:
        return Path(copy)
    try:
        return wheel_root()
    except SglangMissing as error:
        pytest.skip(str(error))


def test_the_pinned_wheel_has_every_name_our_adapter_reads() -> None:
    assert problems(wheel(), SGLANG) == []


def test_the_families_are_read_from_the_wheel() -> None:
    families = metric_families(wheel())
    # a counter's family loses its _total, as prometheus_client's parser names it
    assert "sglang:num_retracted_requests" in families
    assert "sglang:num_retracted_requests_total" not in families
    assert f"sglang=={SGLANG_VERSION}" in NO_DEPS_WHEELS


def test_the_sglang_standins_metrics_are_the_wheels() -> None:
    served = {family.name for family in SglangMetrics("m").registry.collect()}
    assert served and served - metric_families(wheel()) == set()


def test_the_sglang_standins_stage_spans_are_the_wheels_stages() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    timeline = Timeline(10**18, 0.04, 0.03, 0.01, prompt_tokens=5, completion_tokens=4)
    _sglang_scheduler_spans(provider.get_tracer("sglang server"), Context(), timeline)
    slices = {s.name for s in exporter.get_finished_spans() if not s.name.startswith("Scheduler")}
    assert slices >= SGLANG.stage_spans - {"chunked_prefill"}
    _trace, stats = load(wheel())
    assert slices - stage_names(stats) == set()


def copy_of_wheel(root: Path, into: Path) -> Path:
    for name in FILES:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)
    return into


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        ("srt/observability/req_time_stats.py", '"prefill_waiting"', '"prefill_queueing"'),
        ("srt/observability/metrics_collector.py", '"sglang:num_queue_reqs"', '"sglang:queued"'),
        ("srt/observability/trace.py", '"gen_ai.usage.completion_tokens"', '"gen_ai.out"'),
    ],
)
def test_a_rename_in_the_wheel_fails_the_contract_test_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, old: str, new: str
) -> None:
    root = copy_of_wheel(wheel(), tmp_path / "sglang")
    source = (root / path).read_text()
    assert old in source
    (root / path).write_text(source.replace(old, new))
    monkeypatch.setenv(COPY_ENV, str(root))
    with pytest.raises(AssertionError) as failure:
        test_the_pinned_wheel_has_every_name_our_adapter_reads()
    assert old.strip('"') in str(failure.value)
