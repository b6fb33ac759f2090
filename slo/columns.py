"""Records as columns (numpy arrays): what the evaluator reads, built without record objects.

A million records as `RequestRecord` objects cost seconds to build; the evaluator only needs a
few columns, so JSONL files and database rows go straight to arrays. Missing numbers are NaN.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slo.records import (
    OPTIONAL_FLOAT,
    REQUIRED_FLOAT,
    RecordError,
    RequestRecord,
    iter_jsonl_dicts,
)
from slo.sli import OUTCOMES

NUMBER_COLUMNS: tuple[str, ...] = (
    *REQUIRED_FLOAT, *OPTIONAL_FLOAT, "output_tokens", "input_tokens", "cached_tokens",
)  # fmt: skip
LIST_COLUMNS: tuple[str, ...] = ("itl_s", "client_itl_s")
ALL_COLUMNS: tuple[str, ...] = NUMBER_COLUMNS + LIST_COLUMNS


@dataclass(frozen=True)
class Gaps:
    """Every inter-token gap of every record, flattened; `owner[i]` is the gap's record row."""

    values: np.ndarray
    owner: np.ndarray

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[float] | None]) -> Gaps:
        lengths = np.fromiter((len(gaps) if gaps else 0 for gaps in lists), np.int64, len(lists))
        chained = itertools.chain.from_iterable(gaps for gaps in lists if gaps)
        values = np.fromiter(chained, np.float64, int(lengths.sum()))
        return cls(values, np.repeat(np.arange(len(lists)), lengths))

    def select(self, mask: np.ndarray) -> Gaps:
        """Gaps of the rows where `mask` holds, owners renumbered to the selected rows."""
        keep = mask[self.owner]
        new_index = np.cumsum(mask) - 1
        return Gaps(self.values[keep], new_index[self.owner[keep]])


@dataclass(frozen=True)
class RecordColumns:
    tier: np.ndarray
    outcome: np.ndarray
    numbers: dict[str, np.ndarray]
    gaps: dict[str, Gaps] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tier)

    def number(self, name: str) -> np.ndarray:
        try:
            return self.numbers[name]
        except KeyError:
            raise KeyError(f"column {name!r} was not loaded") from None

    def has(self, name: str) -> bool:
        return name in self.numbers or name in self.gaps

    def select(self, mask: np.ndarray) -> RecordColumns:
        return RecordColumns(
            self.tier[mask],
            self.outcome[mask],
            {name: values[mask] for name, values in self.numbers.items()},
            {name: gaps.select(mask) for name, gaps in self.gaps.items()},
        )

    def with_missing(self, names: Collection[str]) -> RecordColumns:
        """The same columns plus `names` as all-missing (NaN numbers, no gaps)."""
        size = len(self)
        numbers = dict(self.numbers)
        gaps = dict(self.gaps)
        for name in names:
            if name in LIST_COLUMNS:
                gaps[name] = Gaps(np.empty(0), np.empty(0, dtype=np.int64))
            else:
                numbers[name] = np.full(size, np.nan)
        return RecordColumns(self.tier, self.outcome, numbers, gaps)

    @classmethod
    def empty(cls) -> RecordColumns:
        return cls.from_dicts([])

    @classmethod
    def from_records(
        cls, records: Iterable[RequestRecord], columns: Collection[str] = ALL_COLUMNS
    ) -> RecordColumns:
        return cls.from_dicts([record.__dict__ for record in records], columns)

    @classmethod
    def from_dicts(
        cls, rows: Sequence[Mapping[str, Any]], columns: Collection[str] = ALL_COLUMNS
    ) -> RecordColumns:
        """Rows already validated (or checked below: a bad value raises ValueError/TypeError)."""
        size = len(rows)
        tier = _strings([row["tier"] for row in rows], size)
        outcome = _strings([row.get("outcome", "ok") for row in rows], size)
        numbers = {
            name: np.array([row.get(name) for row in rows], dtype=np.float64).reshape(size)
            for name in NUMBER_COLUMNS
            if name in columns or name in REQUIRED_FLOAT
        }
        gaps = {
            name: Gaps.from_lists([row.get(name) for row in rows])
            for name in LIST_COLUMNS
            if name in columns
        }
        return cls(tier, outcome, numbers, gaps)

    @classmethod
    def from_rows(cls, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> RecordColumns:
        """Database rows (tuples in the order of `names`), e.g. from a SELECT."""
        size = len(rows)
        if size and not any(name in LIST_COLUMNS for name in names):
            # One C-level pass into a 2-D object array, then per-column casts (None -> NaN):
            # three times faster than transposing the tuples in Python.
            table = np.array(rows, dtype=object).reshape(size, len(names))
            by_name: dict[str, Any] = {name: table[:, i] for i, name in enumerate(names)}
        else:
            by_name = dict(zip(names, zip(*rows, strict=True), strict=True)) if rows else {}
        tier = _strings(list(by_name.get("tier", ())), size)
        outcome = _strings(list(by_name.get("outcome", ())), size)
        numbers = {
            name: np.asarray(by_name.get(name, ()), dtype=object).astype(np.float64).reshape(size)
            for name in names
            if name in NUMBER_COLUMNS
        }
        gaps = {
            name: Gaps.from_lists([_json_list(value) for value in by_name.get(name, ())])
            for name in names
            if name in LIST_COLUMNS
        }
        return cls(tier, outcome, numbers, gaps)


def _strings(values: list[Any], size: int) -> np.ndarray:
    if size == 0:
        return np.array([], dtype=str)
    array = np.array(values)
    if array.dtype.kind != "U":
        raise TypeError("tier and outcome must be strings")
    return array


def _json_list(value: Any) -> list[float] | None:
    if value is None or isinstance(value, list):
        return value
    decoded = json.loads(value)
    return decoded if isinstance(decoded, list) else None


# Lines parsed per chunk: bounds the memory of the temporary dicts (about 1 KB per record).
_CHUNK_LINES = 65536


def load_jsonl_columns(path: str | Path, columns: Collection[str] = ALL_COLUMNS) -> RecordColumns:
    """Read a JSONL file straight into columns.

    The fast path parses a chunk of lines in one C call and checks the columns vectorized; on
    any problem it re-reads the file line by line with full validation, so the error names the
    line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RecordError(f"{path}: cannot open ({error.strerror})") from None
    lines = [line for line in data.splitlines() if line.strip()]
    del data
    try:
        chunks = []
        for start in range(0, len(lines), _CHUNK_LINES):
            rows = json.loads(b"[" + b",".join(lines[start : start + _CHUNK_LINES]) + b"]")
            if not all(isinstance(row, dict) and "request_id" in row for row in rows):
                raise TypeError("not an object with a request_id")
            chunk = RecordColumns.from_dicts(rows, columns)
            _check_columns(chunk)
            chunks.append(chunk)
        return concatenate(chunks) if chunks else RecordColumns.from_dicts([], columns)
    except (ValueError, TypeError, KeyError):
        # Full validation finds and names the first bad line (it raises RecordError).
        return RecordColumns.from_dicts(list(iter_jsonl_dicts(path)), columns)


def concatenate(parts: Sequence[RecordColumns]) -> RecordColumns:
    """One RecordColumns from several with the same columns, gap owners renumbered."""
    offsets = np.cumsum([0] + [len(part) for part in parts[:-1]])
    first = parts[0]
    return RecordColumns(
        np.concatenate([part.tier for part in parts]),
        np.concatenate([part.outcome for part in parts]),
        {name: np.concatenate([part.numbers[name] for part in parts]) for name in first.numbers},
        {
            name: Gaps(
                np.concatenate([part.gaps[name].values for part in parts]),
                np.concatenate(
                    [
                        part.gaps[name].owner + offset
                        for part, offset in zip(parts, offsets, strict=True)
                    ]
                ),
            )
            for name in first.gaps
        },
    )


def _check_columns(result: RecordColumns) -> None:
    if not np.isin(result.outcome, OUTCOMES).all():
        raise ValueError("unknown outcome")
    for name, values in result.numbers.items():
        if name in REQUIRED_FLOAT and np.isnan(values).any():
            raise ValueError(f"missing {name}")
        if name != "timestamp" and (values < 0).any():
            raise ValueError(f"negative {name}")
        if np.isinf(values).any():
            raise ValueError(f"infinite {name}")
    for gaps in result.gaps.values():
        if not np.isfinite(gaps.values).all() or (gaps.values < 0).any():
            raise ValueError("bad gap")
