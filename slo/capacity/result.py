"""capacity.json: what a capacity search found, written by `slo bench --find-max-*`, read by
`slo plan` and `slo report`.

    {"version": 1, "mode": "rate" | "concurrency", "max_rate": 41.5 (or "max_concurrency"),
     "per_tier": {"premium": {"max_rate": 41.5, "binding_objective": "p95 ttft <= 200ms",
                              "binding_at": 43.6, "severity": 1.31}, ...},
     "steps": [{"step": 1, "rate": 32.0, "verdict": "pass", "goodput_rps": ..., "tiers": {...}}],
     "engine": {...}, "window": {...}, ...}

A tier's own `max_rate` is the highest load of a step it passed, whatever the other tiers
did; its binding objective is the one that failed, furthest past its bound, at the lowest
load above that where the tier failed: the first objective to give way as load rises.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slo.errors import UsageError

VERSION = 1
MODES = {"rate": "requests/s", "concurrency": "requests in flight"}


def load_key(mode: str) -> str:
    return "max_rate" if mode == "rate" else "max_concurrency"


def per_tier(steps: Sequence[Mapping[str, Any]], mode: str) -> dict[str, dict[str, Any]]:
    """Each tier's own highest passing load and the objective that bound it first."""
    names: list[str] = []
    for step in steps:
        names += [name for name in step.get("tiers", {}) if name not in names]
    tiers: dict[str, dict[str, Any]] = {}
    for name in names:
        judged = [
            (float(step[mode]), step["tiers"][name])
            for step in steps
            if name in step.get("tiers", {}) and step.get("verdict") != "client_behind"
        ]
        passing = [load for load, tier in judged if tier["verdict"] == "pass"]
        best = max(passing) if passing else None
        above = sorted(
            (load, tier)
            for load, tier in judged
            if tier["verdict"] == "fail" and (best is None or load > best)
        )
        entry: dict[str, Any] = {load_key(mode): best, "binding_objective": None}
        if above:
            load, tier = above[0]
            failed = [o for o in tier["objectives"] if o["verdict"] != "met"]
            if failed:
                worst = max(failed, key=lambda o: o["severity"] or 0.0)
                entry.update(
                    binding_objective=worst["objective"],
                    binding_at=load,
                    severity=worst["severity"],
                    observed_s=worst["observed_s"],
                    threshold_s=worst["threshold_s"],
                )
        else:
            entry["note"] = "not bound: it met its objectives at every load it was judged at"
        tiers[name] = entry
    return tiers


def write(path: Path, document: Mapping[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(
            f"--out {path.parent}: cannot write capacity.json ({error.strerror})"
        ) from None


def read(path: str | Path) -> dict[str, Any]:
    """A capacity.json, checked for what `slo plan` and `slo report` need."""
    file = Path(path)
    if file.is_dir():
        file = file / "capacity.json"
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(
            f"{file}: cannot read ({error.strerror}); write one with "
            "`slo bench --find-max-rate --out DIR`"
        ) from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{file}:{error.lineno}: not JSON ({error.msg})") from None
    mode = document.get("mode") if isinstance(document, dict) else None
    if mode not in MODES or not isinstance(document.get("steps"), list):
        raise UsageError(
            f"{file}: not a capacity.json (needs 'mode' rate|concurrency and 'steps'); "
            "write one with `slo bench --find-max-rate --out DIR`"
        )
    return document
