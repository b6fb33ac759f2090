"""Adding a latency SLI is three files: CONTRIBUTING.md's example, made for real.

The three edits are taken from CONTRIBUTING.md ("Add a latency SLI, end to end") and made in a
copy of the packages; in a fresh interpreter on that copy, a spec asking `p95 first_chunk <=
300ms` parses, and one streamed request through the middleware reaches the record, its
histogram on /metrics and the live /slo. If the page's example stops working, or needs a
fourth file, this fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slo", "middleware", "dashboards", "alerts")
SECTION = "## Add a latency SLI, end to end"

SCRIPT = """
import asyncio, json, sys
import middleware, slo
from middleware import LatencyMiddleware, ScriptedClock
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.tier_specs import make_tier, spec_yaml
from tests.helpers.scripted_stream import call, vllm_style_app

copy = sys.argv[1]
assert middleware.__file__.startswith(copy) and slo.__file__.startswith(copy)
spec = SLOSpec.from_yaml(spec_yaml(make_tier("standard", "p95 first_chunk <= 300ms", default=True)))
store = RecordStore(f"sqlite:///{copy}/records.db")
clock = ScriptedClock()
app = LatencyMiddleware(vllm_style_app(clock, []), store=store, clock=clock, spec=spec, model="m")


async def get(path):
    sent = []
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "state": {},
             "query_string": b""}
    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def scenario():
    await call(app, clock, {"model": "m", "messages": [], "stream": True})
    return (await get("/metrics")).decode(), json.loads(await get("/slo"))


metrics, live = asyncio.run(scenario())
store.flush()
(record,) = store.query()
app.close()
count = [line for line in metrics.splitlines()
         if line.startswith("llm_slo_time_to_first_chunk_seconds_count")]
print(json.dumps({"first_chunk_s": record.first_chunk_s, "ttft_s": record.ttft_s,
                  "histogram_count": count, "slo": live}))
"""


def example_blocks() -> list[str]:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 3, f"CONTRIBUTING.md's example has {len(blocks)} python blocks, not 3"
    return [textwrap.dedent(block) for block in blocks]


def insert_after(path: Path, anchor: str, code: str, indent: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: the anchor {anchor!r} is not there once"
    indented = textwrap.indent(code, indent)
    path.write_text(source.replace(anchor, anchor + indented, 1))


def test_the_contributing_example_adds_a_latency_sli_in_three_files(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    catalog, record, measurement = example_blocks()
    entry = catalog.rstrip() + ",\n"  # an element of the tuple
    insert_after(copy / "slo" / "sli.py", "_SLIS: tuple[SLI, ...] = (\n", entry, "    ")
    insert_after(copy / "slo" / "records.py", "    ttft_s: float | None = None\n", record, "    ")
    breakdown = copy / "middleware" / "request" / "breakdown.py"
    breakdown.write_text(breakdown.read_text() + "\n\n" + measurement)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(copy)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # The role chunk left at 42 ms (2 ms body + 40 ms), the first text at 45 ms.
    assert abs(got["first_chunk_s"] - 0.042) < 1e-9 and abs(got["ttft_s"] - 0.045) < 1e-9
    counts = got["histogram_count"]  # series are born at zero for every tier and route
    assert (
        [line for line in counts if not line.endswith(" 0.0")]
        == [line for line in counts if 'tier="standard"' in line and line.endswith(" 1.0")]
        != []
    ), counts
    (tier,) = got["slo"]["tiers"]
    (objective,) = tier["objectives"]
    assert objective["sli"] == "first_chunk" and objective["verdict"] == "met", objective
    assert (objective["events"], objective["good"]) == (1.0, 1.0), objective  # 42 ms <= 300 ms
