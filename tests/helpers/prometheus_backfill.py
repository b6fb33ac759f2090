"""Known series in a real Prometheus, at the times they stand for, with recording rules over them.

Scrapes (time, OpenMetrics text) become one OpenMetrics file, every sample stamped with its
scrape's time and labelled with the target's `instance` and `job`, which
`promtool tsdb create-blocks-from openmetrics` turns into TSDB blocks. Recording rules are
evaluated over them by the Prometheus (a range query per rule, at whole steps, the rule's
labels and record name set as the rule manager sets them) and their records backfilled the same
way. A rule that reads another rule's record sees it once that record's blocks are loaded, and
Prometheus loads new blocks when it starts: so the rules go in levels (a rule's level is one
more than the highest of the records it reads), Prometheus restarting on the same data between
levels, a fraction of a second each.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from alerts.rule_types import Rule
from tests.helpers.binaries import binary
from tests.helpers.prometheus_process import prometheus

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
DATA_DIR = "prom-data"  # where tests.helpers.prometheus_process keeps its TSDB


# A sample line: its name, its labels (quoted values may hold any character), its value; a
# timestamp or an exemplar after that is dropped.
_SAMPLE = re.compile(r'([^{ ]+)(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})? (\S+)')


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics_backfill(scrapes: Sequence[tuple[float, str]], target: Mapping[str, str]) -> str:
    """One OpenMetrics text of every scrape: each family once, its samples in time order
    (created timestamps left out, as a scrape stores none), `target`'s labels on each."""
    extra = ",".join(f'{key}="{_escape(value)}"' for key, value in target.items())
    families: dict[str, tuple[list[str], list[str]]] = {}
    for at, text in scrapes:
        samples: list[str] = []
        new: set[str] = set()  # families first seen in this scrape: their header lines
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) < 3:  # "# EOF"
                    continue
                if parts[2] not in families:
                    new.add(parts[2])
                header, samples = families.setdefault(parts[2], ([], []))
                if parts[2] in new:
                    header.append(line)
                continue
            match = _SAMPLE.match(line)
            assert match is not None, f"not an OpenMetrics sample: {line!r}"
            name, labels, value = match.groups()
            if not name.endswith("_created"):
                inner = f"{labels},{extra}" if labels else extra
                samples.append(f"{name}{{{inner}}} {value} {at:.3f}")
    lines = [line for header, samples in families.values() for line in (*header, *samples)]
    return "\n".join([*lines, "# EOF", ""])


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"


def create_blocks(text: str, data_dir: Path, work: Path) -> None:
    """The OpenMetrics text as blocks under `data_dir`."""
    source = work / "backfill.om"
    source.write_text(text)
    data_dir.mkdir(parents=True, exist_ok=True)
    backfill = [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics"]
    _run([*backfill, str(source), str(data_dir)])


def _reads(rule: Rule, records: set[str]) -> set[str]:
    return set(_NAME.findall(rule.expr)) & records


def needed_rules(rules: Iterable[Rule], exprs: Iterable[str]) -> list[Rule]:
    """The recording rules the expressions read, and those these read, and so on."""
    recording = [rule for rule in rules if rule.record is not None]
    records = {rule.record for rule in recording if rule.record}
    wanted = {name for expr in exprs for name in _NAME.findall(expr)} & records
    while True:
        more = {n for rule in recording if rule.record in wanted for n in _reads(rule, records)}
        if more <= wanted:
            return [rule for rule in recording if rule.record in wanted]
        wanted |= more


def rule_levels(rules: Sequence[Rule]) -> list[list[Rule]]:
    """The rules by level, in the order their groups evaluate them (a rule reads what the
    rules before it wrote, so one may read another series of its own record's name, as
    goodput's event count reads availability's): level 0 reads no record of `rules`, level n
    reads records the rules before it wrote up to level n - 1."""
    records = {rule.record for rule in rules if rule.record}
    written: dict[str, int] = {}  # record -> the highest level that wrote it so far
    levels: list[list[Rule]] = []
    for rule in rules:
        reads = _reads(rule, records)
        early = reads - set(written)
        assert not early, f"{rule.record} reads {sorted(early)} before a rule writes it"
        n = 1 + max((written[name] for name in reads), default=-1)
        levels.extend([] for _ in range(n + 1 - len(levels)))
        levels[n].append(rule)
        written[rule.record or ""] = max(written.get(rule.record or "", -1), n)
    return levels


def _evaluated(url: str, rule: Rule, start: float, end: float, step_s: float) -> list[str]:
    """The rule's record at every step from `start` to `end`, as the rule manager writes it:
    the result's labels, the rule's labels over them, the record's name."""
    params: dict[str, str | float] = {
        "query": rule.expr,
        "start": start,
        "end": end,
        "step": step_s,
    }
    payload = httpx.get(f"{url}/api/v1/query_range", params=params, timeout=30).json()
    assert payload["status"] == "success", (rule.record, rule.expr, payload)
    lines = []
    for series in payload["data"]["result"]:
        labels = {k: v for k, v in series["metric"].items() if k != "__name__"} | rule.labels
        inner = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
        lines += [f"{rule.record}{{{inner}}} {value} {at}" for at, value in series["values"]]
    return lines


def backfill_rules(
    url: str, rules: Sequence[Rule], start: float, end: float, step_s: float, work: Path
) -> None:
    """Evaluate `rules` against the Prometheus at `url` at every `step_s` from `start` to `end`
    (whole steps, as promtool's rule tests evaluate: promtool's own rule backfill shifts every
    evaluation by a per-group offset, so a 5-minute tile would not end on a scrape) and write
    their records as blocks into its data directory (loaded at its next start)."""
    families: dict[str, list[str]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        evaluated = pool.map(lambda rule: _evaluated(url, rule, start, end, step_s), rules)
        for rule, lines in zip(rules, evaluated, strict=True):
            assert rule.record is not None, rule
            families.setdefault(rule.record, []).extend(lines)
    lines = [
        line
        for record, samples in families.items()
        for line in (f"# TYPE {record} gauge", *samples)
    ]
    create_blocks("\n".join([*lines, "# EOF", ""]), work / DATA_DIR, work)


@contextlib.contextmanager
def backfilled_prometheus(
    tmp_path: Path,
    scrapes: Sequence[tuple[float, str]],
    target: Mapping[str, str],
    rules: Sequence[Rule] = (),
    interval: str = "15s",
    rule_step_s: float = 60.0,
) -> Iterator[str]:
    """A Prometheus over the scrapes and the rules' records from the first scrape to the
    last; yields its URL. `interval` is its evaluation interval (a subquery's default step)."""
    create_blocks(openmetrics_backfill(scrapes, target), tmp_path / DATA_DIR, tmp_path)
    start, end = scrapes[0][0], scrapes[-1][0]
    for level in rule_levels(list(rules)):
        with prometheus(tmp_path, [], interval=interval) as url:
            backfill_rules(url, level, start, end, rule_step_s, tmp_path)
    with prometheus(tmp_path, [], interval=interval) as url:
        yield url
