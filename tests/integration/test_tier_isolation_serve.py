"""`slo serve` with a spec that sets TTFT objectives, default flags, over real HTTP: the slo
policy chosen by the spec, and the settings, the reason and the promise in /health and
/v1/models; a
request whose tier's TTFT objective is out of reach shed with a 429 naming the reason, and
the shed counted by tier and reason in /metrics (outcome `shed` in the request counter)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from tests.helpers.servers import slo_serve
from tests.helpers.tier_specs import premium_batch_spec

# premium's TTFT objective (1 us) is out of reach for any real prefill; batch has none.
SPEC = premium_batch_spec("p95 ttft <= 1us")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder: Path = tmp_path_factory.mktemp("tier-serve")
    spec = folder / "slo.yaml"
    spec.write_text(SPEC)
    with slo_serve(
        "--spec", str(spec), "--store", f"sqlite:///{folder / 'records.db'}",
        "--max-batch-size", "8", "--max-num-batched-tokens", "64",
        "--kv-cache-blocks", "128", "--max-model-len", "512",
    ) as base_url:  # fmt: skip
        yield base_url


def completion(base_url: str, tier: str, max_tokens: int = 8) -> httpx.Response:
    return httpx.post(
        base_url + "/v1/completions",
        json={"model": "bundled:tiny", "prompt": "Hello there " * 8, "max_tokens": max_tokens},
        headers={"x-llm-tier": tier},
        timeout=30,
    )


def test_settings_show_in_health_and_models(served: str) -> None:
    health = httpx.get(served + "/health").json()["scheduling"]
    # No --scheduling: the spec's TTFT objective chose slo, and /health says so.
    assert health["policy"] == "slo"
    assert health["policy_reason"].startswith("default: ") and "premium" in health["policy_reason"]
    assert "TTFT" in health["policy_promise"] and "shed" in health["policy_promise"]
    assert health["max_batch_size"] == 8 and health["max_num_batched_tokens"] == 64
    assert health["kv_cache_blocks"] == 128 and health["max_model_len"] == 512
    model = httpx.get(served + "/v1/models").json()["data"][0]
    assert model["max_model_len"] == 512 and model["scheduling"] == health


def test_an_out_of_reach_ttft_objective_is_shed_with_a_429(served: str) -> None:
    # Batch requests (no TTFT objective: never shed) teach the engine its prefill time.
    with ThreadPoolExecutor(4) as pool:
        warm = list(pool.map(lambda _: completion(served, "batch", 16), range(8)))
    assert all(response.status_code == 200 for response in warm)

    response = completion(served, "premium")
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "ttft_out_of_reach" and "TTFT objective" in error["message"]
    assert response.headers["retry-after"]

    metrics = httpx.get(served + "/metrics").text
    shed = [
        line
        for line in metrics.splitlines()
        if line.startswith("llm_slo_shed_requests_total{")
        and 'tier="premium"' in line
        and 'reason="ttft_out_of_reach"' in line
    ]
    assert shed and float(shed[0].rsplit(" ", 1)[1]) == 1.0
    outcome = [
        line
        for line in metrics.splitlines()
        if line.startswith("llm_slo_requests_total{")
        and 'tier="premium"' in line
        and 'outcome="shed"' in line
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in outcome) == 1.0
