"""An engine's own /metrics read into the engine gauges: each engine's real family names and label
sets (vLLM and SGLang rendered by prometheus_client, as they are; TGI as metrics-rs renders it;
llama-server as its server.cpp writes it), several label sets, a counter's increments, text
that is not Prometheus, and the docs mapping table (docs/proxy.md) against the registry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from middleware.live.page import engine_now
from middleware.metrics.metric_set import MetricSet
from middleware.upstream import ADAPTERS
from middleware.upstream.engine_metrics import (
    EngineMetricsScraper,
    PreemptionDeltas,
    mapping_table,
    metrics_url,
    read_metrics,
)
from slo.spec import SLOSpec

DOCS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "proxy.md"
URL = "http://127.0.0.1:8080/metrics"


def vllm_text(waiting: tuple[float, float], preempted: tuple[float, float]) -> str:
    """Two data-parallel engines, as vLLM v1's PrometheusStatLogger registers them."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    queued = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels, registry=registry)
    old_kv = Gauge("vllm:gpu_cache_usage_perc", "Deprecated.", labels, registry=registry)
    preemptions = Counter("vllm:num_preemptions", "Preemptions.", labels, registry=registry)
    tokens = Counter("vllm:prompt_tokens", "Prefill tokens.", labels, registry=registry)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels, registry=registry)
    kv_used = (0.25, 0.5)
    for engine, (wait, preempt, used) in enumerate(zip(waiting, preempted, kv_used, strict=True)):
        series = ("Qwen/Qwen2.5-0.5B-Instruct", str(engine))
        running.labels(*series).set(4 + engine)
        queued.labels(*series).set(wait)
        kv.labels(*series).set(used)
        old_kv.labels(*series).set(0.99)  # the older name loses to the current one
        preemptions.labels(*series).inc(preempt)
        tokens.labels(*series).inc(1000)
        ttft.labels(*series).observe(0.05)
    return generate_latest(registry).decode()


def sglang_text(retracted: float) -> str:
    """Two data-parallel scheduler ranks, as SGLang's SchedulerMetricsCollector labels them."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
    running = Gauge("sglang:num_running_reqs", "Running.", labels, registry=registry)
    queued = Gauge("sglang:num_queue_reqs", "Waiting queue.", labels, registry=registry)
    usage = Gauge("sglang:token_usage", "The token usage.", labels, registry=registry)
    old = Gauge("sglang:num_retracted_reqs", "Retracted (gauge).", labels, registry=registry)
    counter = Counter(
        "sglang:num_retracted_requests_total", "Retracted.", labels, registry=registry
    )
    for rank in (0, 1):
        series = ("meta-llama/Llama-3.1-8B-Instruct", "unified", "0", "0", "0", str(rank))
        running.labels(*series).set(10)
        queued.labels(*series).set(2 + rank)
        usage.labels(*series).set(0.5 + rank / 4)
        old.labels(*series).set(1)
        counter.labels(*series).inc(retracted)
    return generate_latest(registry).decode()


# TGI's router renders with metrics-exporter-prometheus: no labels on these, counters without a
# `_total` suffix, a blank line between families.
TGI_TEXT = """\
# TYPE tgi_request_count counter
tgi_request_count 12

# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{method="prefill"} 12
tgi_batch_inference_count{method="decode"} 240

# TYPE tgi_queue_size gauge
tgi_queue_size 4

# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 6

# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096

# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="0.00015"} 0
tgi_request_queue_duration_bucket{le="0.000225"} 3
tgi_request_queue_duration_bucket{le="+Inf"} 12
tgi_request_queue_duration_sum 0.5
tgi_request_queue_duration_count 12
"""

# llama-server --metrics (tools/server/server.cpp): HELP, TYPE and value per item, no labels.
LLAMA_SERVER_TEXT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 7801
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 140.26
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.7
"""


@pytest.mark.parametrize(
    ("text", "engine", "gauges", "preemptions"),
    [
        # Counts summed over the two engines, the fuller KV cache, batch size = running.
        (
            vllm_text(waiting=(3, 5), preempted=(7, 2)),
            "vllm",
            {"queue_depth": 8, "running": 9, "batch_size": 9, "kv_usage": 0.5},
            [7, 2],
        ),
        (
            sglang_text(retracted=4),
            "sglang",
            {"queue_depth": 5, "running": 20, "batch_size": 20, "kv_usage": 0.75},
            [4, 4],
        ),
        (TGI_TEXT, "tgi", {"queue_depth": 4, "running": 6, "batch_size": 6}, []),
        (LLAMA_SERVER_TEXT, "llamacpp", {"queue_depth": 3, "running": 2, "batch_size": 2}, []),
    ],
    ids=["vllm", "sglang", "tgi", "llama-server"],
)
def test_each_engine_maps_onto_the_engine_gauges(
    text: str, engine: str, gauges: dict[str, float], preemptions: list[float]
) -> None:
    reading = read_metrics(text)
    assert reading is not None
    assert reading.engine == engine
    assert reading.gauges == pytest.approx(gauges)
    assert sorted(reading.preemptions.values(), reverse=True) == preemptions


def test_a_counter_becomes_increments_series_by_series() -> None:
    deltas = PreemptionDeltas()
    one, two, three = (("engine", "0"),), (("engine", "1"),), (("engine", "2"),)
    assert deltas.grew({one: 7, two: 3}) == 0  # the baseline: what came before the proxy
    assert deltas.grew({one: 9, two: 3}) == 2
    assert deltas.grew({one: 1, two: 4}) == 2  # engine 0 restarted: its 1 is new
    assert deltas.grew({one: 1, two: 4, three: 5}) == 5  # a new engine counts whole
    assert deltas.grew({one: 1, three: 5}) == 0  # one gone: nothing grew


def spec_metrics() -> MetricSet:
    return MetricSet(SLOSpec.default(), "m", CollectorRegistry())


def samples(metrics: MetricSet, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The exported samples of one metric, by their labels."""
    found = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_proxy_exports_the_engine_and_the_slo_page_shows_it() -> None:
    metrics = spec_metrics()
    scraper = EngineMetricsScraper(URL, metrics.set_engine_gauges)
    scraper.take(vllm_text(waiting=(3, 5), preempted=(7, 2)))
    # Engine-wide queue and preemptions go to the spec's default tier only.
    default = SLOSpec.default().default_tier.name
    assert samples(metrics, "llm_slo_queue_depth") == {(("model", "m"), ("tier", default)): 8}
    assert samples(metrics, "llm_slo_running_requests") == {(("model", "m"),): 9}
    assert samples(metrics, "llm_slo_kv_cache_usage_ratio") == {(("model", "m"),): 0.5}
    assert samples(metrics, "llm_slo_preemptions_total") == {(("model", "m"), ("tier", default)): 0}
    scraper.take(vllm_text(waiting=(0, 1), preempted=(10, 2)))
    assert samples(metrics, "llm_slo_preemptions_total") == {(("model", "m"), ("tier", default)): 3}
    assert engine_now(metrics) == {
        "running": 9,
        "batch_size": 9,
        "kv_usage": 0.5,
        "queue_depth": {default: 1},
    }


def test_what_an_engine_does_not_report_is_not_exported() -> None:
    metrics = spec_metrics()
    EngineMetricsScraper(URL, metrics.set_engine_gauges).take(TGI_TEXT)
    assert samples(metrics, "llm_slo_kv_cache_usage_ratio") == {}  # TGI has no KV gauge
    assert samples(metrics, "llm_slo_batch_size") == {(("model", "m"),): 6}


def test_text_that_is_not_prometheus_is_logged_once_and_clears_the_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = spec_metrics()
    scraper = EngineMetricsScraper(URL, metrics.set_engine_gauges, interval_s=2)
    scraper.take(LLAMA_SERVER_TEXT)
    assert samples(metrics, "llm_slo_running_requests") == {(("model", "m"),): 2}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            scraper.take("<html><body>502 Bad Gateway</body></html>\n")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert URL in warnings[0] and "not Prometheus text" in warnings[0]
    assert "every 2 s" in warnings[0] and "--upstream-metrics off" in warnings[0]
    # No longer known: not exported, rather than the last value forever.
    assert samples(metrics, "llm_slo_running_requests") == {}
    scraper.take(LLAMA_SERVER_TEXT)  # back
    assert samples(metrics, "llm_slo_running_requests") == {(("model", "m"),): 2}


def test_an_exposition_of_no_known_engine_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = spec_metrics()
    before = samples(metrics, "llm_slo_queue_depth")
    assert len(before) == len(SLOSpec.default().tiers)  # every tier's child, born at 0
    scraper = EngineMetricsScraper(URL, metrics.set_engine_gauges)
    with caplog.at_level(logging.WARNING):
        scraper.take("# TYPE llm_slo_queue_depth gauge\nllm_slo_queue_depth 3\n")
        scraper.take("# TYPE llm_slo_queue_depth gauge\nllm_slo_queue_depth 3\n")
    (warning,) = [r.getMessage() for r in caplog.records]
    engines = ", ".join(sorted(name for name, a in ADAPTERS.items() if a.metrics))
    assert f"no metric family of a known engine ({engines})" in warning
    assert samples(metrics, "llm_slo_queue_depth") == before


def test_metrics_url_choices() -> None:
    assert metrics_url("auto", "http://127.0.0.1:8080/") == "http://127.0.0.1:8080/metrics"
    assert metrics_url("off", "http://127.0.0.1:8080") is None
    assert metrics_url("http://10.0.0.2:9090/m", "http://x") == "http://10.0.0.2:9090/m"
    with pytest.raises(ValueError, match="not off, auto or an http"):
        metrics_url("127.0.0.1:8080/metrics", "http://x")


def test_the_docs_table_is_the_registry() -> None:
    table = mapping_table()
    assert table in DOCS_PAGE.read_text()
    for adapter in ADAPTERS.values():
        for family in adapter.metrics:
            assert f"`{family}`" in table
