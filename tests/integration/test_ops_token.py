"""The operations endpoints behind `--ops-token-file`, on the real `slo proxy` over TLS: 401
without the token (or with a wrong one), 200 with it, for /metrics, /slo, /slo.html and
POST /v1/traces; the page's login-free way (`/slo.html?token=` once, then a cookie); open and
said so at start without a token; and a real Prometheus scraping with the job `slo generate`
wrote, counting every request, while the same job without the token is refused."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from slo.cli.bench.server import free_port, stop_process
from slo.sli import CATALOG
from tests.helpers.binaries import binary
from tests.helpers.polling import wait_until
from tests.helpers.prometheus_process import process, query
from tests.helpers.proxy_process import tls_proxy
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.servers import uvicorn_thread
from tests.helpers.tls import Pki

pytestmark = pytest.mark.integration

TOKEN = "ops-7f3a9c2e1b5d4680a1b2c3d4e5f60718"
ENDPOINTS = [("GET", "/metrics"), ("GET", "/slo"), ("GET", "/slo.html"), ("POST", "/v1/traces")]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "ops-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with uvicorn_thread(OpenAIUpstream()) as url:
        yield url


@pytest.fixture(scope="module")
def guarded(
    pki: Pki, upstream: str, token_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    db = tmp_path_factory.mktemp("records") / "records.db"
    with tls_proxy(pki, upstream, db, "--ops-token-file", str(token_file)) as url:
        yield url


def _call(url: str, method: str, path: str, pki: Pki, **kwargs: object) -> httpx.Response:
    if method == "POST":
        kwargs.setdefault("json", {})
    with httpx.Client(verify=pki.client_context(), follow_redirects=False) as client:
        return client.request(method, url + path, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_each_ops_endpoint_needs_the_token(guarded: str, pki: Pki, method: str, path: str) -> None:
    refused = _call(guarded, method, path, pki)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert refused.json()["error"]["type"] == "authentication_error"
    assert TOKEN not in refused.text
    wrong = _call(guarded, method, path, pki, headers={"authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401
    allowed = _call(guarded, method, path, pki, headers={"authorization": f"Bearer {TOKEN}"})
    assert allowed.status_code == 200, allowed.text


def test_the_llm_routes_are_not_behind_the_ops_token(guarded: str, pki: Pki) -> None:
    answer = _call(guarded, "POST", "/v1/completions", pki, json={"prompt": "x", "max_tokens": 1})
    assert answer.status_code == 200


def test_the_page_opens_in_a_browser_with_the_token_once(guarded: str, pki: Pki) -> None:
    with httpx.Client(verify=pki.client_context(), follow_redirects=False) as browser:
        assert browser.get(guarded + "/slo.html?token=wrong").status_code == 401
        first = browser.get(guarded + f"/slo.html?token={TOKEN}&range=1h")
        assert first.status_code == 303
        assert first.headers["location"] == "/slo.html?range=1h"  # the token leaves the URL
        cookie = first.headers["set-cookie"]
        for attribute in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
            assert attribute in cookie
        assert TOKEN not in cookie
        assert browser.get(guarded + "/slo.html").status_code == 200  # the cookie, kept
        assert browser.get(guarded + "/slo?view=page").status_code == 200  # what it refreshes from
        assert browser.post(guarded + "/v1/traces", json={}).status_code == 401  # never the intake


def test_without_a_token_they_stay_open_and_the_start_says_so(
    upstream: str, tmp_path: Path
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream]
    command += ["--port", str(port), "--store", f"sqlite:///{tmp_path / 'r.db'}"]
    command += ["--upstream-metrics", "off", "--provider-name", "test"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url + "/metrics"), 60, "slo proxy to answer")
        for method, path in ENDPOINTS:
            extra = {"json": {}} if method == "POST" else {}
            assert httpx.request(method, url + path, **extra).status_code == 200  # type: ignore[arg-type]
    finally:
        stop_process(child)
    _, stderr = child.communicate()
    warnings = [line for line in stderr.splitlines() if "--ops-token-file" in line]
    assert len(warnings) == 1 and "/metrics" in warnings[0], stderr


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


def test_prometheus_scrapes_with_the_generated_job(
    guarded: str, pki: Pki, token_file: Path, tmp_path: Path
) -> None:
    target = guarded.removeprefix("https://")
    out = tmp_path / "generated"
    subprocess.run(
        [sys.executable, "-m", "slo.cli", "generate", "--out", str(out), "--scrape-target",
         target, "--scrape-ca-file", str(pki.ca), "--ops-token-file", str(token_file)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    config = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["authorization"]["credentials_file"] == str(token_file)
    # The test's only changes: scrape every second, and the same job without the token as a
    # control, which must be refused.
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    config["rule_files"] = []
    control = {key: value for key, value in job.items() if key != "authorization"}
    config["scrape_configs"].append({**control, "job_name": "no-token"})
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    requests = 7
    for _ in range(requests):
        answer = _call(
            guarded, "POST", "/v1/completions", pki, json={"prompt": "x", "max_tokens": 2}
        )
        assert answer.status_code == 200
    expected = _counted(guarded, pki)
    assert expected >= requests
    port = free_port()
    command = [
        binary("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    prometheus_url = f"http://127.0.0.1:{port}"
    metric = CATALOG["requests"].metric
    with process(command, f"{prometheus_url}/-/ready", tmp_path / "prometheus.log"):

        def scraped() -> bool:
            rows = query(prometheus_url, f'sum({metric}{{job="llm-slo"}})')
            return bool(rows) and float(rows[0]["value"][1]) == expected

        def up() -> dict[str, str]:
            return {row["metric"]["job"]: row["value"][1] for row in query(prometheus_url, "up")}

        wait_until(scraped, 30, f"Prometheus to count {expected} requests")
        # Each job's first scrape comes at its own offset within the interval: the control's
        # may land a moment after the guarded job's.
        wait_until(lambda: len(up()) == 2, 30, "Prometheus to scrape both jobs")
        assert up() == {"llm-slo": "1", "no-token": "0"}


def _counted(url: str, pki: Pki) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = _call(url, "GET", "/metrics", pki, headers={"authorization": f"Bearer {TOKEN}"}).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == CATALOG["requests"].metric
    )
