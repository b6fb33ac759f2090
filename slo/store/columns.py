"""Records as columns (numpy arrays): what the evaluator reads, built without record objects.

A million records as `RequestRecord` objects cost seconds to build; the evaluator only needs a
few columns, so JSONL files and database rows go straight to arrays. Missing numbers are NaN.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec
import numpy as np

from slo.records import (
    INT_FIELDS,
    OPTIONAL_FLOAT,
    REQUIRED_FLOAT,
    RecordError,
    RequestRecord,
    iter_jsonl_dicts,
)
from slo.sli import OUTCOMES

NUMBER_COLUMNS: tuple[str, ...] = (
    *REQUIRED_FLOAT,
    *OPTIONAL_FLOAT,
    "output_tokens",
    "input_tokens",
    "cached_tokens",
)
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

    @classmethod
    def concatenate(cls, parts: Sequence[Gaps], rows: Sequence[int]) -> Gaps:
        """The gaps of consecutive row blocks (`rows[i]` rows in block i), owners renumbered."""
        offsets = np.cumsum([0, *rows])[:-1]
        owners = [part.owner + offset for part, offset in zip(parts, offsets, strict=True)]
        return cls(
            np.concatenate([np.empty(0), *(part.values for part in parts)]),
            np.concatenate([np.empty(0, dtype=np.int64), *owners]),
        )

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
    codes = _Codes()
    codes.add(values, size)
    array = codes.strings()
    if array.dtype.kind != "U":
        raise TypeError("tier and outcome must be strings")
    return array


class _Codes(dict[Any, int]):
    """A string column with few distinct values (tiers, outcomes), built as integer codes
    chunk by chunk: cheaper than numpy's conversion of a list of strings."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[np.ndarray] = []

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self)
        return code

    def add(self, values: Iterable[Any], size: int) -> None:
        self.parts.append(np.fromiter(map(self.__getitem__, values), np.intp, size))

    def strings(self) -> np.ndarray:
        if not self:
            return np.array([], dtype=str)
        return np.array(list(self))[np.concatenate(self.parts)]


def _json_list(value: Any) -> list[float] | None:
    if value is None or isinstance(value, list):
        return value
    decoded = json.loads(value)
    return decoded if isinstance(decoded, list) else None


# Bytes read and decoded at a time: bounds the memory of the file and of the row objects.
_CHUNK_BYTES = 1 << 24
_OBJECTS_MEET = re.compile(rb"}[ \t\r]*{")  # two objects on one line? (_one_object_per_line)


def load_jsonl_columns(path: str | Path, columns: Collection[str] = ALL_COLUMNS) -> RecordColumns:
    """Read a JSONL file straight into columns.

    The fast path decodes only the needed fields, typed in C (msgspec), chunk by chunk, and
    checks the columns vectorized; on any problem it re-reads the file line by line with full
    validation, so the error names the line.
    """
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as error:
        raise RecordError(f"{path}: cannot open ({error.strerror})") from None
    try:
        with handle:
            return _decode_jsonl(_line_chunks(handle), columns)
    except OSError as error:
        raise RecordError(f"{path}: cannot read ({error.strerror})") from None
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, OverflowError):
        # Full validation finds and names the first bad line (it raises RecordError).
        return RecordColumns.from_dicts(list(iter_jsonl_dicts(path)), columns)


def _line_chunks(handle: BinaryIO) -> Iterator[bytes]:
    """The file in chunks of about _CHUNK_BYTES that end at a line end."""
    while chunk := handle.read(_CHUNK_BYTES):
        yield chunk if chunk.endswith(b"\n") else chunk + handle.readline()


def _decode_jsonl(chunks: Iterable[bytes], columns: Collection[str]) -> RecordColumns:
    row_type = _row_type(frozenset(columns))
    decoder = msgspec.json.Decoder(row_type)
    fields = row_type.__struct_fields__
    names = [name for name in NUMBER_COLUMNS if name in fields]
    gap_names = [name for name in LIST_COLUMNS if name in fields]
    numbers_of = operator.attrgetter(*names)
    table_type = np.dtype([(name, np.float64) for name in names])
    tables: list[np.ndarray] = [np.empty(0, table_type)]  # an empty file has no chunk
    sizes: list[int] = []
    tiers, outcomes = _Codes(), _Codes()
    gap_parts: dict[str, list[Gaps]] = {name: [] for name in gap_names}
    for chunk in chunks:
        if not chunk.isascii():
            chunk.decode()  # msgspec does not check the fields it skips; the line reader does
        rows = decoder.decode_lines(chunk)
        if not _one_object_per_line(chunk, len(rows)):
            raise ValueError("more than one JSON value on a line")
        # One pass for every number column (None -> NaN); one contiguous copy each at the end.
        tables.append(np.fromiter(map(numbers_of, rows), table_type, len(rows)))
        sizes.append(len(rows))
        tiers.add(map(operator.attrgetter("tier"), rows), len(rows))
        outcomes.add(map(operator.attrgetter("outcome"), rows), len(rows))
        for name in gap_names:
            gap_parts[name].append(Gaps.from_lists([getattr(row, name) for row in rows]))
    result = RecordColumns(
        tiers.strings(),
        outcomes.strings(),
        {name: np.concatenate([table[name] for table in tables]) for name in names},
        {name: Gaps.concatenate(parts, sizes) for name, parts in gap_parts.items()},
    )
    _check_columns(result)
    return result


@functools.lru_cache(maxsize=16)
def _row_type(columns: frozenset[str]) -> type[msgspec.Struct]:
    """A record of only the needed fields, typed as `validate_record` checks them.

    Other fields are skipped without building objects. Optional seconds default to NaN (null
    still decodes to None) so that the rows convert to floats in one C pass.
    """
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("request_id", str),
        ("tier", str),
        ("timestamp", float),
        ("e2e_s", float),
        ("outcome", Literal[OUTCOMES], "ok"),  # type: ignore[valid-type]
    ]
    for name in NUMBER_COLUMNS:
        if name in columns and name not in REQUIRED_FLOAT:
            fields.append((name, int, 0) if name in INT_FIELDS else (name, float | None, math.nan))
    fields += [(name, list[float] | None, None) for name in LIST_COLUMNS if name in columns]
    return msgspec.defstruct("JsonlRecord", fields, gc=False)


def _one_object_per_line(chunk: bytes, objects: int) -> bool:
    """Whether the `objects` decoded from `chunk` came one per line, as the line reader (the
    reference) requires: decode_lines reads a stream of values and accepts `{..}{..}`.

    Two objects share a line only where "}" meets "{" across JSON whitespace other than a line
    end; a non-object value fails the decoding. Only where that pattern shows (it may be
    inside a string) are the lines counted.
    """
    if not _OBJECTS_MEET.search(chunk):
        return True
    return sum(1 for line in chunk.split(b"\n") if line.strip()) == objects


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
