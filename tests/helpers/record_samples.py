"""Synthetic request records for store and check tests: cheap to make, every field exercised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from slo.records import FIELD_NAMES

TIERS = ("premium", "standard", "batch")
START = 1_700_000_000.0


def sample_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` records one millisecond apart; optional fields present on some, absent on others."""
    rng = np.random.default_rng(seed)
    ttft = np.round(rng.lognormal(-2.0, 0.5, count), 6)
    output_tokens = rng.integers(1, 64, count)
    tpot = np.round(rng.lognormal(-3.5, 0.3, count), 6)
    outcomes = np.array(["ok", "server_error", "client_error", "timeout"])[
        rng.choice(4, count, p=[0.97, 0.01, 0.015, 0.005])
    ]
    records = []
    for i in range(count):
        tokens = int(output_tokens[i])
        e2e = round(float(ttft[i] + tpot[i] * (tokens - 1)) + 0.001, 6)
        record: dict[str, Any] = {
            "request_id": f"req-{seed}-{i}",
            "timestamp": START + i * 0.001,
            "tier": TIERS[i % 3],
            "model": "bundled:tiny",
            "route": "/v1/completions",
            "outcome": str(outcomes[i]),
            "status_code": 200,
            "stream": bool(i % 2),
            "input_tokens": 12,
            "output_tokens": tokens,
            "cached_tokens": i % 5,
            "e2e_s": e2e,
            "ttft_s": float(ttft[i]),
            "queue_s": 0.0005,
            "prefill_s": 0.01,
            "decode_s": 0.2,
            "detokenize_s": 0.0001,
            "network_s": 0.0003,
            "other_s": 0.0002,
        }
        if tokens > 1:
            record["tpot_s"] = float(tpot[i])
        if i % 10 == 0:
            record["trace_id"] = f"{i:032x}"
            record["itl_s"] = [float(tpot[i])] * min(tokens - 1, 3)
        if i % 7 == 0:
            record["client_ttft_s"] = float(ttft[i]) + 0.002
            record["client_e2e_s"] = e2e + 0.003
        # In the store's field order, so an export reproduces the file byte for byte.
        records.append({name: record[name] for name in FIELD_NAMES if name in record})
    return records


def write_sample_file(records: list[dict[str, Any]], path: Path) -> Path:
    """The sample dicts as a JSONL run file (not `slo.records.write_jsonl`, which takes records)."""
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


def phase_parts(record: Any) -> list[float]:
    """The six additive phases of a record, all required present: they must sum to its e2e."""
    names = ("network_s", "other_s", "queue_s", "prefill_s", "decode_s", "detokenize_s")
    values = [getattr(record, name) for name in names]
    missing = [name for name, value in zip(names, values, strict=True) if value is None]
    assert not missing, f"record {record.request_id} has no {', '.join(missing)}"
    return values
