"""`slo check` evaluation against pandas (read + groupby-quantile), same data, same run.

Sizes 10k, 100k and 1M records, from JSONL and from SQLite. Ours: load the needed columns,
evaluate every objective of the example spec (percentiles, attainment, burn rates over seven
windows, goodput, classification) and render the JSON report. Peer: pandas reads the same
file or table and computes, per tier, the quantile and attainment of each latency objective
and availability. Ratios (ours / pandas; below 1 is faster) print at the end (-s to see them).
The two take turns, round by round, so that both meet the same load on a shared machine; the
fastest round of each counts (15 rounds at 10k, 3 at 100k and at 1M).

    python -m pytest tests/benchmarks/test_check_speed.py -p no:cacheprovider \
        --benchmark-enable -o addopts='' -s

LLM_SLO_BENCH_SIZES=10000,100000 limits the sizes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from slo.columns import load_jsonl_columns
from slo.evaluate import columns_needed, evaluate
from slo.report_format import render_json
from slo.spec import SLOSpec
from slo.store import TABLE, RecordStore

pd = pytest.importorskip("pandas")

SIZES = [
    int(size) for size in os.environ.get("LLM_SLO_BENCH_SIZES", "10000,100000,1000000").split(",")
]
SPEC = SLOSpec.default()
RESULTS: dict[tuple[str, int], dict[str, float]] = {}
_LINE = (
    '{"request_id":"r%d","timestamp":%.3f,"tier":"%s","model":"tiny","route":"/v1/completions",'
    '"outcome":"%s","status_code":200,"stream":true,"input_tokens":12,"output_tokens":%d,'
    '"cached_tokens":0,"e2e_s":%.6f,"ttft_s":%.6f,"tpot_s":%.6f,"queue_s":0.0005,'
    '"prefill_s":0.01,"decode_s":0.2,"detokenize_s":0.0001,"network_s":0.0003,"other_s":0.0002}\n'
)


def _columns(size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(size)
    ttft = rng.lognormal(-2.0, 0.5, size)
    tokens = rng.integers(2, 200, size)
    tpot = rng.lognormal(-3.5, 0.3, size)
    return {
        "timestamp": 1.7e9 + np.arange(size) * (86400.0 / size),
        "tier": np.array(["premium", "standard", "batch"])[rng.integers(0, 3, size)],
        "outcome": np.where(rng.random(size) < 0.995, "ok", "server_error"),
        "output_tokens": tokens,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": ttft + tpot * (tokens - 1),
    }


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Path]]:
    """Per size: a JSONL file (template formatting, no json.dumps) and a SQLite store."""
    out = {}
    for size in SIZES:
        folder = tmp_path_factory.mktemp(f"n{size}")
        c = _columns(size)
        rows = list(zip(*(c[k].tolist() for k in ("timestamp", "tier", "outcome", "output_tokens",
                                                  "e2e_s", "ttft_s", "tpot_s")), strict=True))  # fmt: skip
        jsonl = folder / "run.jsonl"
        with jsonl.open("w") as handle:
            handle.writelines(_LINE % (i, *row) for i, row in enumerate(rows))
        db = folder / "records.db"
        RecordStore(f"sqlite:///{db}").close()  # our schema and indexes
        with sqlite3.connect(db) as connection:
            connection.executemany(
                f"INSERT INTO {TABLE.name} (request_id, timestamp, tier, outcome, output_tokens, "
                "e2e_s, ttft_s, tpot_s, model, route, status_code, stream, input_tokens, "
                "cached_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'tiny', '/v1/completions', 200, 1, 12, 0)",
                [(f"r{i}", *row) for i, row in enumerate(rows)],
            )
        out[size] = (jsonl, db)
    return out


def ours_jsonl(path: Path) -> str:
    return render_json(evaluate(SPEC, load_jsonl_columns(path, columns_needed(SPEC))))


def ours_sqlite(path: Path) -> str:
    store = RecordStore(f"sqlite:///{path}")
    try:
        return render_json(evaluate(SPEC, store.columns(columns=columns_needed(SPEC))))
    finally:
        store.close()


def pandas_summary(frame: pd.DataFrame) -> dict[str, float]:
    """The peer: per tier, each latency objective's quantile and attainment; availability."""
    summary: dict[str, float] = {}
    ok = frame[frame["outcome"] == "ok"]
    for tier in SPEC.tiers:
        for objective in tier.latency_objectives:
            values = ok.loc[ok["tier"] == tier.name, f"{objective.sli}_s"].dropna()
            summary[f"{tier.name}/{objective.name}/q"] = values.quantile(objective.target)
            summary[f"{tier.name}/{objective.name}/a"] = (values <= objective.threshold_s).mean()
    availability = frame.assign(good=frame["outcome"] == "ok").groupby("tier")["good"].mean()
    summary.update({f"{tier}/availability": value for tier, value in availability.items()})
    return summary


def pandas_jsonl(path: Path) -> dict[str, float]:
    return pandas_summary(pd.read_json(path, lines=True))


def pandas_sqlite(path: Path) -> dict[str, float]:
    with sqlite3.connect(path) as connection:
        frame = pd.read_sql_query(
            f"SELECT tier, outcome, timestamp, e2e_s, ttft_s, tpot_s FROM {TABLE.name}", connection
        )
    return pandas_summary(frame)


SOURCES: dict[str, tuple[Callable[[Path], object], Callable[[Path], object], int]] = {
    "jsonl": (ours_jsonl, pandas_jsonl, 0),
    "sqlite": (ours_sqlite, pandas_sqlite, 1),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_check_speed(benchmark, datasets, source: str, size: int) -> None:  # type: ignore[no-untyped-def]
    ours, peer, index = SOURCES[source]
    path = datasets[size][index]
    rounds = max(3, min(15, 300_000 // size))  # 10k: 15, 100k and 1M: 3
    peer_times: list[float] = []

    def run_peer() -> None:  # right before each round of ours, untimed by the fixture
        start = time.perf_counter()
        peer(path)
        peer_times.append(time.perf_counter() - start)

    benchmark.group = f"check {source}"
    benchmark.pedantic(
        ours, args=(path,), setup=run_peer, rounds=rounds, iterations=1, warmup_rounds=0
    )
    ours_s, peer_s = benchmark.stats.stats.min, min(peer_times)
    benchmark.extra_info.update(
        pandas_s=peer_s, ratio=ours_s / peer_s, us_per_record=ours_s / size * 1e6
    )
    RESULTS[(source, size)] = {"ours": ours_s, "pandas": peer_s}


def test_report_ratios() -> None:
    """Prints the table; the benchmark's claim is the ratio column, read by a person."""
    assert RESULTS, "run the benchmarks first (same session)"
    print("\nsource  records    slo check   pandas   ratio   us/record (ours)")
    for (source, size), times in sorted(RESULTS.items()):
        print(f"{source:7} {size:>9,} {times['ours']:9.3f}s {times['pandas']:8.3f}s "
              f"{times['ours'] / times['pandas']:6.2f}x {times['ours'] / size * 1e6:9.2f}")  # fmt: skip
