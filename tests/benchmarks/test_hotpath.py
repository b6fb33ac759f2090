"""The compiled per-event hot path against its pure-Python twin, on the same streams in the
same run: µs of the middleware's per-event bookkeeping per SSE event.

The workload is what `middleware.request.exchange.Exchange` does per streamed chunk (the wire scan,
`WireReader.token_events_in`, and the timeline's mark, `RequestTimeline.chunk_sent`) and once
per request (the inter-token gaps, their bucket search for the ITL histogram and the
live-window update), on vLLM-shaped streams of 64 events: a role chunk, content deltas,
a finish chunk, a usage chunk and `[DONE]`, one event per piece as the engines send them.
Rounds alternate between the two implementations (`tests.helpers.hotpath.using`) and each
figure is the median round. No sockets, no event loop: what is measured is the Python the
hot path costs, which is what compiling it changes.

Run alone, by hand (HOTPATH_ROUNDS=3 for a short proof that it works):

    python -m pytest tests/benchmarks/test_hotpath.py -o addopts= -s -p no:cacheprovider

Writes docs/benchmarks/hotpath.md. Goal: the compiled path is faster (ratio above 1). A
second test says why Cython: the pure-Python twin compiled by mypyc (built here, about two
minutes) against the Cython module, on the scan and the bucket search.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from middleware import _hotpath_py, hotpath
from middleware.clock import ScriptedClock
from middleware.live.windows import WindowSet
from middleware.metrics.histograms import bucket_counts
from middleware.request.timeline import RequestTimeline
from middleware.wire.reader import WireReader
from slo.sli import buckets_for
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.hotpath import implementations, using

ROUNDS = int(os.environ.get("HOTPATH_ROUNDS", "15"))
STREAMS = 200  # per round
EVENTS = 64  # per stream
PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "hotpath.md"
WORDS = [" the", " latency", " of", " token", " é", " 日本", "\n", ' "quoted"', " 🙂", " is"]


def _event(data: object) -> bytes:
    return (
        b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    )


def _chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    head = {"id": "chatcmpl-8f3a", "object": "chat.completion.chunk", "created": 1764640000}
    return _event({**head, "model": "meta-llama/Llama-3.1-8B-Instruct", "choices": [choice]})


def streams(seed: int = 7) -> list[list[bytes]]:
    """vLLM's shape: a role chunk (`{"role": "assistant", "content": ""}`), EVENTS - 4 content
    deltas, a finish chunk (empty delta, finish_reason "stop"), a usage chunk (no choices),
    `[DONE]`: EVENTS pieces."""
    rng = random.Random(seed)
    made = []
    for _ in range(STREAMS):
        pieces = [_chunk({"role": "assistant", "content": ""})]
        pieces += [_chunk({"content": rng.choice(WORDS)}) for _ in range(EVENTS - 4)]
        pieces.append(_chunk({}, "stop"))
        usage = {"prompt_tokens": 40, "completion_tokens": EVENTS - 4, "total_tokens": EVENTS + 36}
        pieces.append(_event({"id": "chatcmpl-8f3a", "choices": [], "usage": usage}))
        pieces.append(b"data: [DONE]\n\n")
        made.append(pieces)
    return made


def per_event_round(inputs: list[list[bytes]]) -> float:
    """µs per event of the per-chunk work: the scan and the mark."""
    clock = ScriptedClock()
    started = time.perf_counter_ns()
    for pieces in inputs:
        reader, timeline = WireReader(), RequestTimeline.begin("r", clock)
        scan, mark = reader.token_events_in, timeline.chunk_sent
        for at, piece in enumerate(pieces):
            mark(at * 1_000_000, scan(piece))
    return (time.perf_counter_ns() - started) / 1e3 / (len(inputs) * EVENTS)


def per_request_round(inputs: list[list[bytes]]) -> float:
    """µs per event of the once-per-request work (gaps, ITL buckets, live windows), spread
    over the request's events."""
    bounds = buckets_for("itl")
    windows = WindowSet([300.0, 3600.0, 21600.0, 86400.0], 24)
    columns, amounts = np.asarray([0, 3, 7]), np.asarray([1.0, 62.0, 0.2])
    timelines = []
    for pieces in inputs:
        timeline = RequestTimeline.begin("r", ScriptedClock())
        timeline.token_chunk_ns = [at * 1_000_000 + (at % 5) * 7_000 for at in range(len(pieces))]
        timelines.append(timeline)
    started = time.perf_counter_ns()
    for index, timeline in enumerate(timelines):
        gaps = hotpath.gaps_s(timeline.token_chunk_ns)
        bucket_counts(bounds, gaps)
        windows.add(1_764_640_000.0 + index * 0.01, columns, amounts)
    return (time.perf_counter_ns() - started) / 1e3 / (len(inputs) * EVENTS)


def measure(rounds: int) -> dict[str, dict[str, float]]:
    inputs = streams()
    samples: dict[str, dict[str, list[float]]] = {
        name: {"event": [], "request": []} for name in implementations()
    }
    for _ in range(rounds):
        for name, parts in samples.items():
            with using(name):
                parts["event"].append(per_event_round(inputs))
                parts["request"].append(per_request_round(inputs))
    return {
        name: {part: statistics.median(values) for part, values in parts.items()}
        for name, parts in samples.items()
    }


def _row(label: str, figures: dict[str, float], pure: dict[str, float]) -> list[object]:
    total = figures["event"] + figures["request"]
    ratio = (pure["event"] + pure["request"]) / total
    return [label, f"{figures['event']:.3f}", f"{figures['request']:.3f}", f"{total:.3f}",
            f"{ratio:.2f}x"]  # fmt: skip


def test_compiled_hot_path_is_faster_than_pure_python() -> None:
    assert "compiled" in implementations(), (
        "build it: pip install -e . (and unset LLM_SLO_PURE_PYTHON)"
    )
    load_at_start = load_average()
    results = measure(ROUNDS)
    pure, compiled = results["pure-python"], results["compiled"]
    rows = [
        _row("compiled (Cython, `middleware._hotpath`)", compiled, pure),
        _row("pure Python (`middleware._hotpath_py`)", pure, pure),
    ]
    header = ["path", "per chunk: scan + mark (µs/event)", "per request, spread (µs/event)",
              "total (µs/event)", "pure Python / this"]  # fmt: skip
    ratio = (pure["event"] + pure["request"]) / (compiled["event"] + compiled["request"])
    text = (
        f"{stamp(load_at_start)}\n\n{ROUNDS} rounds (median shown), each {STREAMS} vLLM-shaped "
        f"streams of {EVENTS} SSE events (role, deltas, finish, usage, `[DONE]`; one event per "
        f"piece), the two paths alternating in the same process.\n\n{table(header, rows)}\n\n"
        f"Goal: the compiled path faster than pure Python. Measured: {ratio:.2f}x faster."
    )
    write_section(PAGE, "The compiled hot path", "hotpath", text)
    print(text)
    assert ratio > 1.0, f"the compiled hot path is not faster: {ratio:.2f}x"


def _mypyc_build(folder: Path) -> ModuleType:
    """The pure-Python twin compiled by mypyc (the other compiler tried), as `hp_mypyc`."""
    source = Path(hotpath.__file__).with_name("_hotpath_py.py")
    (folder / "hp_mypyc.py").write_text(source.read_text())
    env = {**os.environ, "MYPYPATH": str(ROOT), "PYTHONPATH": str(ROOT)}
    subprocess.run(["mypyc", "hp_mypyc.py"], cwd=folder, env=env, check=True, timeout=900,
                   capture_output=True)  # fmt: skip
    sys.path.insert(0, str(folder))
    return importlib.import_module("hp_mypyc")


def _reader_class(module: ModuleType) -> type[WireReader]:
    """A WireReader on `module`'s scan. mypyc's functions are not descriptors (they do not bind
    as methods), so its `_decoded_has_text` needs a Python method around it."""
    if module.__name__ == "hp_mypyc":

        class Wrapped(WireReader):
            __slots__ = ()

            def _decoded_has_text(self, chunk: Any) -> bool:
                return bool(module.decoded_has_text(self, chunk))

        return Wrapped

    class Bound(WireReader):
        __slots__ = ()
        _decoded_has_text = module.decoded_has_text

    return Bound


def _scan_and_buckets(module: ModuleType, inputs: list[list[bytes]]) -> tuple[float, float]:
    reader_class, scan = _reader_class(module), module.token_events_in
    started = time.perf_counter_ns()
    for pieces in inputs:
        reader = reader_class()
        for piece in pieces:
            scan(reader, piece)
    per_event = (time.perf_counter_ns() - started) / 1e3 / (len(inputs) * EVENTS)
    bounds, gaps = buckets_for("itl"), [random.Random(3).expovariate(30) for _ in range(63)]
    started = time.perf_counter_ns()
    for _ in range(2000):
        module.bucket_counts(bounds, gaps)
    return per_event, (time.perf_counter_ns() - started) / 1e3 / 2000


def test_cython_against_mypyc_on_the_scan_and_the_bucket_search(tmp_path: Path) -> None:
    """Why Cython: the same twin compiled by mypyc, against Cython's typed module and pure
    Python, on the scan (called as a function, no method binding) and the bucket search."""
    if shutil.which("mypyc") is None or "compiled" not in implementations():
        pytest.skip("needs mypyc (pip install mypy) and the Cython build")
    load_at_start = load_average()
    modules = {"pure Python": _hotpath_py, "mypyc (the twin compiled)": _mypyc_build(tmp_path)}
    modules["Cython (`middleware._hotpath`)"] = hotpath.compiled()
    inputs = streams()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in modules}
    for _ in range(ROUNDS):
        for name, module in modules.items():
            samples[name].append(_scan_and_buckets(module, inputs))
    medians = {
        name: tuple(statistics.median(sample[i] for sample in values) for i in range(2))
        for name, values in samples.items()
    }
    rows = [[name, f"{scan:.3f}", f"{buckets:.2f}"] for name, (scan, buckets) in medians.items()]
    header = ["compiler", "scan (µs/event)", "bucket search, 63 gaps (µs/request)"]
    text = (
        f"{stamp(load_at_start)}\n\n{ROUNDS} rounds (median shown), the streams above; the "
        f"scan alone (`token_events_in(reader, piece)`).\n\n{table(header, rows)}"
    )
    write_section(PAGE, "The compiled hot path", "hotpath-compilers", text)
    print(text)
    cython_scan = medians["Cython (`middleware._hotpath`)"][0]
    assert cython_scan < min(scan for scan, _ in medians.values() if scan != cython_scan)
