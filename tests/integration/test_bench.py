"""`slo bench` against real servers on 127.0.0.1.

- `slo serve` (bundled engine + middleware): every request has the client's and the server's
  view, the client never sees a token before the server sent it, and the records agree with
  the server's own /metrics counts.
- An independent OpenAI-compatible server (a few lines of Starlette streaming with scripted
  delays, no llm-slo inside): the client-side TTFT and ITL match the script within a few ms.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slo.cli import main
from slo.records import read_jsonl
from tests.helpers.scripted_server import SCRIPTED_GAPS_S, SCRIPTED_TTFT_S
from tests.helpers.servers import free_port, slo_serve, wait_until_ready
from tests.helpers.tier_specs import every_tier_spec

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

TOLERANCE_S = 0.015  # loopback, one process: scheduling noise stays well under this
# How late the client may see a chunk the server sent: under the smallest scripted gap, so a
# chunk taken for its neighbour still fails, with room for a busy 2-core machine's scheduling.
ARRIVAL_SLACK_S = 0.018


@contextlib.contextmanager
def scripted_server() -> Iterator[str]:
    """The scripted server in its own process, as an independent server would be (in a thread
    of the test process, the GIL's 5 ms switch interval would blur the very ms measured)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("compares perf_counter across processes: CLOCK_MONOTONIC on Linux")
    port = free_port()
    code = f"from tests.helpers.scripted_server import serve_scripted; serve_scripted({port})"
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/health", process=process)
        # one request first: a fresh server pays for lazy imports on its first stream
        warm = {"model": "scripted", "prompt": "[999]", "max_tokens": 5, "stream": True}
        httpx.post(url + "/v1/completions", json=warm, timeout=10).raise_for_status()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("profile", ["chat", "code"])  # chat and text completions
def test_client_timings_match_a_scripted_server(profile: str, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    with scripted_server() as url:
        argv = ["bench", "--url", url, "--profile", profile, "--requests", "4",
                "--concurrency", "1", "--out", str(out), "--quiet"]  # fmt: skip
        assert main(argv) == 0
        sent_at = httpx.get(url + "/stamps", timeout=10).json()
    records = read_jsonl(out)
    assert len(records) == 4
    for record in records:
        assert record.outcome == "ok" and record.model == "scripted"
        assert record.output_tokens == 5 and record.input_tokens == 12  # from usage
        ttft, gaps = record.client_ttft_s, record.client_itl_s or []
        assert ttft is not None and len(gaps) == len(SCRIPTED_GAPS_S)
        # against what the server really did (same clock): its own wait plus connecting,
        # sending and delivery, a few ms
        arrived, *chunks = sent_at[record.request_id]
        assert chunks[0] - arrived <= ttft <= chunks[0] - arrived + ARRIVAL_SLACK_S
        # Each chunk is seen after the server sent it and soon after (ARRIVAL_SLACK_S), on the same
        # clock (a chunk delivered late lengthens one gap and shortens the next, so judging
        # arrivals, not single gaps, keeps one scheduling hiccup from counting twice).
        seen = list(itertools.accumulate(gaps, initial=ttft))
        sent = [chunk - arrived for chunk in chunks]
        for seen_at, sent_at_s in zip(seen, sent, strict=True):
            assert sent_at_s <= seen_at <= sent_at_s + ARRIVAL_SLACK_S, (seen, sent)
        # e2e and TPOT follow from the same clock: the last chunk plus the usage/[DONE] tail
        tail = (record.client_e2e_s or 0) - (ttft + sum(gaps))
        assert 0 <= tail <= 0.005
        assert record.client_tpot_s == pytest.approx((record.client_e2e_s - ttft) / 4, abs=2e-6)
        # no llm-slo on that server: no server view, the client's e2e stands in
        assert record.ttft_s is None and record.e2e_s == record.client_e2e_s
    # against the script: the typical request (a busy machine makes single sleeps overshoot)
    ttfts = [record.client_ttft_s or 0.0 for record in records]
    assert SCRIPTED_TTFT_S - 0.002 <= statistics.median(ttfts) <= SCRIPTED_TTFT_S + TOLERANCE_S
    for position, scripted in enumerate(SCRIPTED_GAPS_S):
        measured = statistics.median((record.client_itl_s or [])[position] for record in records)
        assert abs(measured - scripted) <= TOLERANCE_S, (position, measured, scripted)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    with scripted_server() as url:
        command = [sys.executable, "-m", "slo.cli", "bench", "--url", url, "--requests", "200",
                   "--concurrency", "2", "--out", str(out), "--quiet"]  # fmt: skip
        # The context manager kills and reaps the process if the test fails midway.
        # SIGINT as at a terminal even when the suite runs in the background (`cmd &` starts
        # with SIGINT ignored, and children inherit that).
        with subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=_default_sigint
        ) as process:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                not out.exists() or len(out.read_text().splitlines()) < 3
            ):
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            try:
                printed, _ = process.communicate(timeout=60)
            finally:
                process.kill()
    assert process.returncode == 130
    records = read_jsonl(out)  # every line whole: nothing half-written
    assert 3 <= len(records) < 200
    assert f"{len(records)} of 200 requests finished" in printed
    assert "stopped by the interrupt" in printed and "per tier" in printed


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("torch")
    store = tmp_path_factory.mktemp("serve") / "records.db"
    with slo_serve("--store", f"sqlite:///{store}") as url:
        yield url


def requests_counted(base_url: str) -> Counter[tuple[str, str]]:
    """llm_slo_requests_total by (tier, route), as the server's /metrics says now."""
    counted: Counter[tuple[str, str]] = Counter()
    metrics = httpx.get(base_url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "llm_slo_requests_total":
                counted[(sample.labels["tier"], sample.labels["route"])] += int(sample.value)
    return counted


def test_every_request_has_both_views_and_the_servers_counts(served: str, tmp_path: Path) -> None:
    chat, code = tmp_path / "chat.jsonl", tmp_path / "code.jsonl"
    before = requests_counted(served)  # the server is shared with the module's other tests
    assert main(["bench", "--url", served, "--profile", "chat", "--requests", "24",
                 "--rate", "8", "--tier-mix", "premium=0.25,standard=0.5,batch=0.25",
                 "--seed", "3", "--out", str(chat), "--quiet"]) == 0  # fmt: skip
    assert main(["bench", "--url", served, "--profile", "code", "--requests", "6",
                 "--concurrency", "2", "--out", str(code), "--quiet"]) == 0  # fmt: skip
    records = read_jsonl(chat) + read_jsonl(code)
    assert len(records) == 30
    assert len({r.request_id for r in records}) == 30
    for r in records:
        assert r.outcome == "ok" and r.request_id.startswith("req-"), r  # the server's id
        assert r.ttft_s is not None and r.client_ttft_s is not None, r
        assert r.client_e2e_s is not None and r.prefill_s is not None and r.queue_s is not None
        assert r.client_ttft_s >= r.ttft_s, r  # no token reaches the client before it is sent
        assert r.client_e2e_s >= r.e2e_s, r
        phases = [r.network_s, r.queue_s, r.prefill_s, r.decode_s, r.detokenize_s, r.other_s]
        assert sum(p or 0.0 for p in phases) == pytest.approx(r.e2e_s, abs=1e-5)

    counted = requests_counted(served) - before
    assert counted == Counter((r.tier, r.route) for r in records)
    assert set(counted) >= {("premium", "/v1/chat/completions"), ("standard", "/v1/completions")}


def test_check_and_report_read_what_bench_wrote(served: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run, page = tmp_path / "run.jsonl", tmp_path / "report.html"
    assert main(["bench", "--url", served, "--profile", "voice", "--requests", "8",
                 "--out", str(run), "--quiet"]) == 0  # fmt: skip
    # A verdict, not bad input, and the right one: objectives no run misses, then one no run
    # meets, over the tiers the run holds.
    tiers = {record.tier for record in read_jsonl(run)}
    for objectives, verdict in (("availability >= 50%", 0), ("p99 ttft <= 1us", 1)):
        spec = tmp_path / f"spec-{verdict}.yaml"
        spec.write_text(every_tier_spec(tiers, objectives))
        assert main(["check", "--spec", str(spec), "--results", str(run)]) == verdict, objectives
    assert main(["report", "--results", str(run), "--out", str(page)]) == 0
    assert page.read_text().count("<svg") == 7  # the blame chart too (no blame: it says so)
