"""`slo demo --scenario overload`: a batch flood hits, once under fifo and once under the
default flags (where the spec's objectives choose the slo policy).

Each act starts `slo serve` (bundled:tiny, the overload spec; `--scheduling fifo`, then no
scheduling flag at all: the policy shown is the one /health says runs) and sends
premium requests (short, streamed, five a second) alone for a few seconds, then beside a batch
flood (closed-loop clients with ~900-token prompts). The live evaluator's /slo is polled every
second: with fifo the premium burn-rate alert fires, with slo scheduling it should not. The
report puts both acts side by side (client-side TTFT and ITL, batch tokens/s, sheds, alerts)
with where the premium requests' time went, from the server's own records.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from slo.cli.paths import output_directory
from slo.errors import UsageError
from slo.sli import SPLIT_PHASES

# The two acts: fifo chosen explicitly, then `slo serve` under its default flags, where the
# spec's objectives choose the slo policy (slo.cli.engine_flags.choose_scheduling).
ACTS: tuple[tuple[str, list[str]], ...] = (("fifo", ["--scheduling", "fifo"]), ("slo", []))
# ~880 tokens with the bundled byte-level tokenizer: with 64 output tokens it fits the 1024.
BATCH_PROMPT = "".join(f"line {i} status ok latency {i * 37 % 997} ms; " for i in range(45))[:880]


@dataclass
class Act:
    policy: str
    flags: str = ""  # the scheduling flags the act's server ran with
    premium_ttft_s: list[float] = field(default_factory=list)
    premium_itl_s: list[float] = field(default_factory=list)
    batch_tokens: int = 0
    flood_s: float = 0.0
    shed: dict[str, int] = field(default_factory=dict)  # tier -> 429s
    alert_fired_at_s: float | None = None  # seconds into the flood
    alert_names: list[str] = field(default_factory=list)
    phases_ms: dict[str, float] = field(default_factory=dict)  # premium mean per phase
    # Of premium's queue and interference blame that names a tier, the share naming batch.
    batch_blame_share: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # batch responses by status / error


async def _premium(client: Any, base_url: str, act: Act, stop_at: float, index: int) -> None:
    body = {
        "model": "bundled:tiny",
        "prompt": f"Premium question {index}: status?",
        "max_tokens": 16,
        "stream": True,
    }
    sent = last = time.perf_counter()
    first = True
    async with client.stream(
        "POST", base_url + "/v1/completions", json=body, headers={"x-llm-tier": "premium"}
    ) as response:
        if response.status_code == 429:
            act.shed["premium"] = act.shed.get("premium", 0) + 1
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if first:
                act.premium_ttft_s.append(now - sent)
                first = False
            else:
                act.premium_itl_s.append(now - last)
            last = now


async def _batch(client: Any, base_url: str, act: Act, stop_at: float, index: int) -> None:
    body = {"model": "bundled:tiny", "prompt": f"job {index}: " + BATCH_PROMPT, "max_tokens": 64}
    while time.perf_counter() < stop_at:
        try:
            response = await client.post(
                base_url + "/v1/completions", json=body, headers={"x-llm-tier": "batch"}
            )
        except Exception as error:  # a demo reports failures, it does not stop
            act.errors[type(error).__name__] = act.errors.get(type(error).__name__, 0) + 1
            await asyncio.sleep(0.5)
            continue
        act.errors[str(response.status_code)] = act.errors.get(str(response.status_code), 0) + 1
        if response.status_code == 429:
            act.shed["batch"] = act.shed.get("batch", 0) + 1
            await asyncio.sleep(1.0)
        elif response.status_code == 200:
            act.batch_tokens += response.json()["usage"]["completion_tokens"]


async def _watch_alerts(
    client: Any, base_url: str, act: Act, flood_at: float, stop_at: float
) -> None:
    while time.perf_counter() < stop_at + 2:
        slo = (await client.get(base_url + "/slo")).json()
        premium = [a for a in slo.get("alerts", []) if "premium" in str(a)]
        if premium and act.alert_fired_at_s is None:
            act.alert_fired_at_s = max(0.0, time.perf_counter() - flood_at)
            act.alert_names = sorted({str(a.get("name") or a.get("alertname")) for a in premium})
        await asyncio.sleep(1.0)


async def _traffic(base_url: str, act: Act, calm_s: float, flood_s: float, clients: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=clients + 64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        began = time.perf_counter()
        flood_at, stop_at = began + calm_s, began + calm_s + flood_s
        premium_tasks = []
        watcher = asyncio.ensure_future(_watch_alerts(client, base_url, act, flood_at, stop_at))
        batch_tasks: list[asyncio.Future[None]] = []
        index = 0
        while time.perf_counter() < stop_at:
            if not batch_tasks and time.perf_counter() >= flood_at:
                batch_tasks = [
                    asyncio.ensure_future(_batch(client, base_url, act, stop_at, c))
                    for c in range(clients)
                ]
            premium_tasks.append(
                asyncio.ensure_future(_premium(client, base_url, act, stop_at, index))
            )
            index += 1
            await asyncio.sleep(0.2)
        await asyncio.gather(*premium_tasks, *batch_tasks)
        act.flood_s = time.perf_counter() - flood_at
        await watcher


def _policy_running(base_url: str) -> str:
    import httpx

    return str(httpx.get(base_url + "/health", timeout=10).json()["scheduling"]["policy"])


def _premium_records(store_url: str) -> list[dict[str, Any]]:
    """The server's records of premium's ok requests."""
    from slo.store import RecordStore

    store = RecordStore(store_url)
    try:
        return [r for r in store.iter_dicts(tier="premium") if r.get("outcome") == "ok"]
    finally:
        store.close()


def _premium_phases(rows: list[dict[str, Any]]) -> dict[str, float]:
    if not rows:
        return {}
    return {
        phase: 1000 * sum(r.get(f"{phase}_s") or 0.0 for r in rows) / len(rows)
        for phase in SPLIT_PHASES
    }


def _batch_blame_share(rows: list[dict[str, Any]]) -> float | None:
    """Of premium's queue and interference blame that names a tier (the engine's exact
    blame, docs/blame.md), the share that names batch."""
    from slo.blame_shares import blame_by_tier, named_share

    premium = blame_by_tier(rows).get("premium")
    return None if premium is None else named_share(premium, "batch", ("queue", "interference"))


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def render(acts: list[Act]) -> str:
    lines = [f"{'':<28}" + "".join(f"{act.policy:>16}" for act in acts)]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"{label:<28}" + "".join(f"{value:>16}" for value in values))

    row("scheduling flags", [act.flags for act in acts])
    row("premium p95 TTFT", [f"{_p(a.premium_ttft_s, 0.95):.0f} ms" for a in acts])
    row("premium p99 ITL", [f"{_p(a.premium_itl_s, 0.99):.0f} ms" for a in acts])
    row("batch tokens/s", [f"{a.batch_tokens / a.flood_s:.0f}" if a.flood_s else "-" for a in acts])
    row(
        "shed (429) premium/batch",
        [f"{a.shed.get('premium', 0)}/{a.shed.get('batch', 0)}" for a in acts],
    )
    row(
        "batch failures",
        [str(sum(n for k, n in a.errors.items() if k not in ("200", "429"))) for a in acts],
    )
    row(
        "premium burn-rate alert",
        [
            f"fired at +{a.alert_fired_at_s:.0f}s" if a.alert_fired_at_s is not None else "quiet"
            for a in acts
        ],
    )
    row(
        "premium's wait named batch",
        [f"{a.batch_blame_share:.0%}" if a.batch_blame_share is not None else "-" for a in acts],
    )
    lines.append("where a premium request's time went (server records, mean):")
    for phase in SPLIT_PHASES:
        row(f"  {phase}", [f"{a.phases_ms.get(phase, float('nan')):.1f} ms" for a in acts])
    return "\n".join(lines)


def render_html(acts: list[Act]) -> str:
    body = html.escape(render(acts))
    return (
        "<!doctype html><meta charset=utf-8><title>slo demo: overload</title>"
        "<h1>Batch flood: fifo against slo scheduling</h1>"
        f"<pre style='font-size:15px'>{body}</pre>"
    )


def run_overload(args: argparse.Namespace) -> int:
    from slo.cli.bench.server import embedded_server

    out = output_directory(args.out)
    spec_path = out / "overload.yaml"
    if args.spec:
        spec_path = Path(args.spec)
        if not spec_path.is_file():
            raise UsageError(f"--spec {spec_path}: no such file")
    else:
        spec_path.write_text(
            resources.files("slo").joinpath("examples/overload.yaml").read_text("utf-8"), "utf-8"
        )
    acts = []
    for policy, extra in ACTS:
        store = out / f"overload-{policy}.db"
        store.unlink(missing_ok=True)
        flags = " ".join(extra) or "default flags"
        print(
            f"slo demo: act {policy} ({flags}): premium alone {args.calm:g}s, then a batch "
            f"flood ({args.flood_clients} clients) for {args.flood:g}s ...",
            flush=True,
        )
        act = Act(policy, flags=flags)
        with embedded_server(
            spec=str(spec_path), store=f"sqlite:///{store}", extra_args=extra
        ) as base_url:
            act.policy = _policy_running(base_url)  # the server's word, not ours
            asyncio.run(_traffic(base_url, act, args.calm, args.flood, args.flood_clients))
        premium = _premium_records(f"sqlite:///{store}")
        act.phases_ms = _premium_phases(premium)
        act.batch_blame_share = _batch_blame_share(premium)
        acts.append(act)
    report = render(acts)
    print("\n" + report)
    (out / "overload.html").write_text(render_html(acts), "utf-8")
    print(f"\nslo demo: report {out / 'overload.html'}; records {out}/overload-*.db")
    return 0
