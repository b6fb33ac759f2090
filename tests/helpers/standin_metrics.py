"""The engine stand-ins' `/metrics`: each engine's real family names and label sets (sources in
tests/helpers/engine_standins.py), through the real prometheus_client, fed by the stand-in's
live state: requests waiting, running, KV cache in use, preemptions, and finished timelines.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tests.helpers.standin_telemetry import Timeline


class EngineMetrics(Protocol):
    def set_state(self, waiting: int, running: int, kv_tokens: int, kv_capacity: int) -> None:
        """The gauges of the scheduler's state now."""

    def preempted(self, count: int) -> None: ...

    def finished(self, timeline: Timeline, finish_reason: str) -> None:
        """Counters and histograms of one finished request (its scripted times)."""

    def render(self) -> bytes: ...


class VllmMetrics:
    """vllm/v1/metrics/loggers.py `PrometheusStatLogger`: labels model_name, engine."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model, "engine": "0"}
        names = list(labels)

        def gauge(name: str) -> Gauge:
            return Gauge(name, name, names, registry=self.registry).labels(**labels)

        def histogram(name: str) -> Histogram:
            return Histogram(name, name, names, registry=self.registry).labels(**labels)

        def counter(name: str) -> Counter:
            return Counter(name, name, names, registry=self.registry).labels(**labels)

        self.running = gauge("vllm:num_requests_running")
        self.waiting = gauge("vllm:num_requests_waiting")
        self.kv = gauge("vllm:kv_cache_usage_perc")
        self.preemptions = counter("vllm:num_preemptions")
        self.prompt_tokens = counter("vllm:prompt_tokens")
        self.generation_tokens = counter("vllm:generation_tokens")
        self.success = Counter(
            "vllm:request_success", "", [*names, "finished_reason"], registry=self.registry
        )
        self.labels = labels
        self.ttft = histogram("vllm:time_to_first_token_seconds")
        self.itl = histogram("vllm:inter_token_latency_seconds")
        self.e2e = histogram("vllm:e2e_request_latency_seconds")
        self.queue = histogram("vllm:request_queue_time_seconds")
        self.prefill = histogram("vllm:request_prefill_time_seconds")
        self.decode = histogram("vllm:request_decode_time_seconds")
        self.inference = histogram("vllm:request_inference_time_seconds")

    def set_state(self, waiting: int, running: int, kv_tokens: int, kv_capacity: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)
        self.kv.set(kv_tokens / kv_capacity)

    def preempted(self, count: int) -> None:
        self.preemptions.inc(count)

    def finished(self, timeline: Timeline, finish_reason: str) -> None:
        self.prompt_tokens.inc(timeline.prompt_tokens)
        self.generation_tokens.inc(timeline.completion_tokens)
        self.success.labels(**self.labels, finished_reason=finish_reason).inc()
        self.ttft.observe(timeline.ttft_s)
        for _ in range(timeline.completion_tokens - 1):
            self.itl.observe(timeline.decode_s)
        self.e2e.observe(timeline.e2e_s)
        self.queue.observe(timeline.queue_s)
        self.prefill.observe(timeline.prefill_s)
        self.decode.observe(timeline.decode_total_s)
        self.inference.observe(timeline.prefill_s + timeline.decode_total_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SglangMetrics:
    """python/sglang/srt/observability/metrics_collector.py: scheduler families carry
    model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; tokenizer families model_name."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        scheduler = {
            "model_name": model,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tokenizer = {"model_name": model}

        def bound(kind: type, name: str, labels: dict[str, str]):  # type: ignore[no-untyped-def]
            return kind(name, name, list(labels), registry=self.registry).labels(**labels)

        self.running = bound(Gauge, "sglang:num_running_reqs", scheduler)
        self.queued = bound(Gauge, "sglang:num_queue_reqs", scheduler)
        self.used_tokens = bound(Gauge, "sglang:num_used_tokens", scheduler)
        self.token_usage = bound(Gauge, "sglang:token_usage", scheduler)
        self.retracted = bound(Counter, "sglang:num_retracted_requests_total", scheduler)
        self.queue_time = bound(Histogram, "sglang:queue_time_seconds", scheduler)
        self.prompt_tokens = bound(Counter, "sglang:prompt_tokens_total", tokenizer)
        self.generation_tokens = bound(Counter, "sglang:generation_tokens_total", tokenizer)
        self.requests = bound(Counter, "sglang:num_requests_total", tokenizer)
        self.ttft = bound(Histogram, "sglang:time_to_first_token_seconds", tokenizer)
        self.itl = bound(Histogram, "sglang:inter_token_latency_seconds", tokenizer)
        self.e2e = bound(Histogram, "sglang:e2e_request_latency_seconds", tokenizer)

    def set_state(self, waiting: int, running: int, kv_tokens: int, kv_capacity: int) -> None:
        self.queued.set(waiting)
        self.running.set(running)
        self.used_tokens.set(kv_tokens)
        self.token_usage.set(kv_tokens / kv_capacity)

    def preempted(self, count: int) -> None:
        self.retracted.inc(count)

    def finished(self, timeline: Timeline, finish_reason: str) -> None:
        self.queue_time.observe(timeline.queue_s)
        self.prompt_tokens.inc(timeline.prompt_tokens)
        self.generation_tokens.inc(timeline.completion_tokens)
        self.requests.inc()
        self.ttft.observe(timeline.ttft_s)
        for _ in range(timeline.completion_tokens - 1):
            self.itl.observe(timeline.decode_s)
        self.e2e.observe(timeline.e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TgiMetrics:
    """router/src/server.rs through metrics-exporter-prometheus: no labels, counters written
    without `_total` and no `_created` series. TGI has no KV-usage gauge and no preemptions;
    `tgi_batch_current_max_tokens` is the nearest (tokens the running batch may reach)."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.queue_size = Gauge("tgi_queue_size", "Current queue size", registry=registry)
        self.batch_size = Gauge("tgi_batch_current_size", "", registry=registry)
        self.batch_tokens = Gauge("tgi_batch_current_max_tokens", "", registry=registry)
        self.count = Counter("tgi_request_count", "", registry=registry)
        self.success = Counter("tgi_request_success", "", registry=registry)

        def duration(name: str) -> Histogram:
            return Histogram(name, "", buckets=TGI_DURATION_BUCKETS, registry=registry)

        self.duration = duration("tgi_request_duration")
        self.validation = duration("tgi_request_validation_duration")
        self.queue = duration("tgi_request_queue_duration")
        self.inference = duration("tgi_request_inference_duration")
        self.per_token = duration("tgi_request_mean_time_per_token_duration")
        self.generated = Histogram("tgi_request_generated_tokens", "", registry=registry)

    def set_state(self, waiting: int, running: int, kv_tokens: int, kv_capacity: int) -> None:
        self.queue_size.set(waiting)
        self.batch_size.set(running)
        self.batch_tokens.set(kv_tokens)

    def preempted(self, count: int) -> None:
        pass  # TGI neither preempts nor counts it

    def finished(self, timeline: Timeline, finish_reason: str) -> None:
        inference_s = timeline.prefill_s + timeline.decode_total_s
        self.count.inc()
        self.success.inc()
        self.duration.observe(timeline.e2e_s)
        self.validation.observe(0.0)
        self.queue.observe(timeline.queue_s)
        self.inference.observe(inference_s)
        self.per_token.observe(inference_s / timeline.completion_tokens)
        self.generated.observe(timeline.completion_tokens)

    def render(self) -> bytes:
        return metrics_rs_text(generate_latest(self.registry).decode()).encode()


def metrics_rs_text(text: str) -> str:
    """prometheus_client's text as the Rust `metrics` exporter writes it: a counter family and
    its samples keep the registered name (no `_total`), and there are no `_created` series."""
    lines = [line for line in text.splitlines() if not _is_created(line)]
    counters = {
        line.split()[2]
        for line in lines
        if line.startswith("# TYPE ")
        and line.endswith(" counter")
        and line.split()[2].endswith("_total")
    }
    renamed = []
    for line in lines:
        words = line.split(" ", 3)
        at = 2 if line.startswith("# ") else 0
        name = words[at].split("{", 1)[0] if len(words) > at else ""
        if name in counters:
            words[at] = name.removesuffix("_total") + words[at][len(name) :]
        renamed.append(" ".join(words))
    return "\n".join(renamed) + "\n"


def _is_created(line: str) -> bool:
    words = line.split()
    name = words[2] if line.startswith("# ") and len(words) > 2 else (words or [""])[0]
    return name.split("{", 1)[0].endswith("_created")


# TGI's buckets for every `*duration` histogram (router/src/server.rs): 0.0001 * 1.5^k, k=1..35.
TGI_DURATION_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))


def engine_metrics(engine: str, model: str) -> EngineMetrics:
    kinds: dict[str, type[VllmMetrics | SglangMetrics | TgiMetrics]] = {
        "vllm": VllmMetrics,
        "sglang": SglangMetrics,
        "tgi": TgiMetrics,
    }
    return kinds[engine](model)
