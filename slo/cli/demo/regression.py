"""`slo demo --scenario regression`: healthy premium traffic, then the bundled engine's
prefill 2x slower; the live judge and the generated rules both say so, and say why.

1. Calibrate: the bare engine serves premium requests (long prompts: prefill is most of the
   first token) and the TTFT objective is set at 1.5x the p95 measured here, so a 2x prefill
   breaches it on any machine (OUT/regression.yaml).
2. Live: the latency middleware, judging by that spec with burn-rate windows short enough
   for a demo (OUT/regression-live.yaml), serves `--calm` seconds healthy, then `--slow`
   seconds with `SlowPrefill` sleeping the healthy prefill mean once more before every
   prefill. /slo is polled every second; /slo.json and /slo.html are kept.
3. Generated rules: the phase means and TTFT the server recorded, before and after, become a
   day of healthy traffic and an hour of regressed traffic at 10 requests/s, which promtool
   runs through the spec's generated rules (`alerts.regression`): which alerts fire, when,
   with which `phase`, labels and annotations as Alertmanager would show them.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from alerts.regression import Fired, Profile, render_example, run_scenario
from slo.cli.demo.regression_server import MODEL, DemoServer, demo_server
from slo.cli.paths import output_directory
from slo.errors import UsageError
from slo.sli import SPLIT_PHASES
from slo.spec import SLOSpec

# ~880 tokens with the bundled byte-level tokenizer: prefill dominates the first token.
PROMPT = "".join(f"line {i} status ok latency {i * 37 % 997} ms; " for i in range(45))[:880]
RATE_PER_S = 4.0
LIVE_POLICY = {
    "min_events": 5,
    "burn_rates": [{"severity": "page", "long": "1m", "short": "10s", "factor": 4}],
    "thresholds": [],
}
FACTOR = 2.0


@dataclass
class Phase:
    """What one act of the live run saw."""

    name: str
    client_ttft_s: list[float] = field(default_factory=list)
    alerts: dict[str, float] = field(default_factory=dict)  # alertname -> s into the act


async def _request(client: Any, base_url: str, phase: Phase, index: int) -> None:
    body = {"model": MODEL, "prompt": f"request {index}: {PROMPT}", "max_tokens": 8, "stream": True}
    sent = time.perf_counter()
    headers = {"x-llm-tier": "premium"}
    async with client.stream(
        "POST", base_url + "/v1/completions", json=body, headers=headers
    ) as response:
        first = True
        async for line in response.aiter_lines():
            if first and line.startswith("data: {"):
                phase.client_ttft_s.append(time.perf_counter() - sent)
                first = False


async def _act(base_url: str, phase: Phase, seconds: float, watch: bool) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        began = time.perf_counter()
        tasks, index, polled = [], 0, began
        while time.perf_counter() - began < seconds:
            tasks.append(asyncio.ensure_future(_request(client, base_url, phase, index)))
            index += 1
            await asyncio.sleep(1 / RATE_PER_S)
            if watch and time.perf_counter() - polled >= 1:
                polled = time.perf_counter()
                for alert in (await client.get(base_url + "/slo")).json().get("alerts", []):
                    name = str(alert.get("alertname") or alert.get("name"))
                    phase.alerts.setdefault(name, polled - began)
        await asyncio.gather(*tasks)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _write_specs(out: Path, threshold_ms: int) -> tuple[Path, Path]:
    """The packaged regression spec with the calibrated TTFT threshold, and its live twin."""
    packaged = resources.files("slo").joinpath("examples/regression.yaml")
    data = yaml.safe_load(packaged.read_text("utf-8"))
    objectives = data["tiers"][0]["objectives"]
    data["tiers"][0]["objectives"] = [
        f"p95 ttft <= {threshold_ms}ms" if o.startswith("p95 ttft") else o for o in objectives
    ]
    rules_spec, live_spec = out / "regression.yaml", out / "regression-live.yaml"
    rules_spec.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    live = {**data, "window": "1h", "alert_policy": LIVE_POLICY}
    live_spec.write_text(yaml.safe_dump(live, sort_keys=False), "utf-8")
    return rules_spec, live_spec


def _records(store_url: str, count: int) -> list[dict[str, Any]]:
    """The server's premium records, once the middleware has written `count` of them."""
    from slo.store import RecordStore

    store = RecordStore(store_url)
    try:
        deadline = time.monotonic() + 10
        while True:
            rows = [r for r in store.iter_dicts(tier="premium") if r.get("outcome") == "ok"]
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)
    finally:
        store.close()


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else 0.0


def _profile(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> Profile:
    """The measured run as the generated rules' input: phase means and TTFT values."""
    means = tuple({p: _mean(rows, f"{p}_s") for p in SPLIT_PHASES} for rows in (before, after))
    ttft = tuple(
        tuple(float(r["ttft_s"]) for r in rows if r.get("ttft_s")) for rows in (before, after)
    )
    return Profile(600, (means[0], means[1]), (ttft[0], ttft[1]), _mean(before, "tpot_s"))


def _serve_measured(
    server: DemoServer, args: argparse.Namespace, spec: Path, store_url: str
) -> Any:
    """Put a latency middleware judging by `spec` in front of the engine (the previous
    one's engine hooks removed); returns it, for the caller to close."""
    from slo.cli.common.middleware import build_middleware

    if server.hooks is not None:
        server.engine.remove_hooks(server.hooks)
    middleware = build_middleware(
        server.bare, args, spec=spec, store=store_url, model=server.engine.name
    )
    server.hooks = middleware.engine_hooks()
    server.engine.add_hooks(server.hooks)
    server.switch.app = middleware
    return middleware


def _calibrate(server: DemoServer, args: argparse.Namespace, out: Path) -> tuple[float, float]:
    """(p95 TTFT, mean prefill) of healthy premium traffic, from the server's records."""
    store = out / "calibration.db"
    store.unlink(missing_ok=True)
    spec = resources.files("slo").joinpath("examples/regression.yaml")
    with resources.as_file(spec) as spec_path:
        middleware = _serve_measured(server, args, spec_path, f"sqlite:///{store}")
    calibration = Phase("calibration")
    asyncio.run(_act(server.base_url, calibration, args.calm, watch=False))
    middleware.close()
    rows = _records(f"sqlite:///{store}", len(calibration.client_ttft_s))
    if not rows:
        raise UsageError("no calibration request finished; see the messages above")
    return _p95([float(r["ttft_s"]) for r in rows if r.get("ttft_s")]), _mean(rows, "prefill_s")


def _live(
    server: DemoServer, args: argparse.Namespace, live_spec: Path, store_url: str, delay_s: float
) -> tuple[Any, tuple[Phase, Phase], float]:
    """Healthy, then every prefill `delay_s` longer. Returns the middleware (closed by the
    caller), the two acts and the moment prefill slowed."""
    middleware = _serve_measured(server, args, live_spec, store_url)
    healthy, slow = Phase("healthy"), Phase(f"prefill {FACTOR:g}x slower")
    _say(f"healthy: premium at {RATE_PER_S:g} requests/s for {args.calm:g}s")
    asyncio.run(_act(server.base_url, healthy, args.calm, watch=True))
    server.slow.delay_s = delay_s
    slowed_at = time.time()
    _say(
        f"regression: every prefill {delay_s * 1000:.0f} ms longer (the healthy mean once "
        f"more) for {args.slow:g}s"
    )
    asyncio.run(_act(server.base_url, slow, args.slow, watch=True))
    return middleware, (healthy, slow), slowed_at


def run_regression(args: argparse.Namespace) -> int:
    import httpx

    out = output_directory(args.out)
    store = out / "regression.db"
    store.unlink(missing_ok=True)
    store_url = f"sqlite:///{store}"
    _say(f"starting {MODEL} in this process; calibrating on {args.calm:g}s of premium traffic")
    with demo_server() as server:
        ttft_p95_s, prefill_s = _calibrate(server, args, out)
        # Half way from the healthy p95 to the p95 a doubled prefill adds up to.
        threshold_ms = math.ceil((ttft_p95_s + (FACTOR - 1) * prefill_s / 2) * 1000)
        rules_spec, live_spec = _write_specs(out, threshold_ms)
        _say(
            f"premium objective: p95 ttft <= {threshold_ms}ms (healthy p95 "
            f"{ttft_p95_s * 1000:.0f} ms, prefill {prefill_s * 1000:.0f} ms)"
        )
        delay_s = (FACTOR - 1) * prefill_s
        middleware, acts, slowed_at = _live(server, args, live_spec, store_url, delay_s)
        for path, url in (("slo.json", "/slo"), ("slo.html", "/slo.html")):
            (out / path).write_bytes(httpx.get(server.base_url + url, timeout=10).content)
        middleware.close()
    rows = _records(store_url, sum(len(a.client_ttft_s) for a in acts))
    before = [r for r in rows if r["timestamp"] < slowed_at]
    after = [r for r in rows if r["timestamp"] >= slowed_at]
    if not before or not after:
        raise UsageError(
            f"the server recorded {len(before)} healthy and {len(after)} "
            "slowed requests; both are needed (raise --calm and --slow)"
        )
    _say("running the generated rules over a day of this traffic, then an hour slowed (promtool)")
    fired = run_scenario(SLOSpec.load(rules_spec), _profile(before, after))
    report = render(acts, before, after, fired)
    print("\n" + report)
    (out / "regression.txt").write_text(report + "\n", "utf-8")
    (out / "regression.html").write_text(_html(report), "utf-8")
    print(
        f"\nslo demo: report {out / 'regression.html'}; the live page {out / 'slo.html'}; "
        f"records {store}"
    )
    return 0


def render(
    acts: tuple[Phase, Phase],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    fired: list[Fired],
) -> str:
    lines = [f"{'premium, server records (mean)':<32}{acts[0].name:>14}{acts[1].name:>22}"]
    for phase in SPLIT_PHASES:
        lines.append(
            f"  {phase:<30}{_mean(before, f'{phase}_s') * 1000:>11.1f} ms"
            f"{_mean(after, f'{phase}_s') * 1000:>19.1f} ms"
        )
    p95s = [f"{_p95(a.client_ttft_s) * 1000:.0f} ms" if a.client_ttft_s else "-" for a in acts]
    lines.append(f"  {'client p95 TTFT':<30}{p95s[0]:>14}{p95s[1]:>22}")
    lines.append("live judge (/slo, burn windows 1m/10s), seconds into each act:")
    for act in acts:
        seen = ", ".join(f"{name} at +{s:.0f}s" for name, s in act.alerts.items()) or "quiet"
        lines.append(f"  {act.name}: {seen}")
    lines += ["generated Prometheus rules over this traffic (promtool):", render_example(fired)]
    return "\n".join(lines)


def _html(report: str) -> str:
    return (
        "<!doctype html><meta charset=utf-8><title>slo demo: regression</title>"
        "<h1>Prefill 2x slower: what the alerts say</h1>"
        f"<pre style='font-size:15px'>{html.escape(report)}</pre>"
    )


def _say(message: str) -> None:
    print(f"slo demo: {message} ...", flush=True)
