"""One `RequestRecord` per finished request: ids, tier, outcome, tokens and every timing.

Never any prompt or completion text. The same record travels as a database row (sqlmodel),
as a dict and as one JSONL line (the format `slo bench` writes and `slo check --results`
reads). Validation errors name the file and line: `run.jsonl:12: field 'e2e_s': ...`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Column
from sqlmodel import Field, SQLModel

from slo.errors import UsageError
from slo.sli import OUTCOMES, TOKENS_SOURCES

TABLE_NAME = "llm_slo_request_records"


class RequestRecord(SQLModel, table=True):
    __tablename__ = TABLE_NAME

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(index=True)
    trace_id: str | None = None
    # Wall-clock unix seconds of the request's start (durations come from monotonic clocks).
    timestamp: float = Field(index=True)
    tier: str = Field(index=True)
    model: str = ""
    route: str = ""
    outcome: str = "ok"
    status_code: int = 200
    stream: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    # Where the token counts come from (slo.sli.TOKENS_SOURCES): how exact they are.
    tokens_source: str | None = None
    # Server view, seconds. The breakdown adds up: the phases of slo.sli.PHASES sum to e2e. Phases stay None where no engine reported them.
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] | None = Field(default=None, sa_column=Column(JSON))
    network_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    queue_prefill_s: float | None = None
    decode_s: float | None = None
    detokenize_s: float | None = None
    other_s: float | None = None
    # Client view, filled by `slo bench`: what the person waiting actually saw.
    client_ttft_s: float | None = None
    client_e2e_s: float | None = None
    client_tpot_s: float | None = None
    client_itl_s: list[float] | None = Field(default=None, sa_column=Column(JSON))

    def to_dict(self) -> dict[str, Any]:
        """Every field but the database id, None values left out."""
        return {
            name: getattr(self, name) for name in FIELD_NAMES if getattr(self, name) is not None
        }

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


REQUIRED_STR = ("request_id", "tier")
OPTIONAL_STR = ("trace_id", "model", "route", "outcome", "tokens_source")
REQUIRED_FLOAT = ("timestamp", "e2e_s")
OPTIONAL_FLOAT = (
    "ttft_s", "tpot_s", "network_s", "queue_s", "prefill_s", "queue_prefill_s", "decode_s",
    "detokenize_s", "other_s", "client_ttft_s", "client_e2e_s", "client_tpot_s",
)  # fmt: skip
INT_FIELDS = ("status_code", "input_tokens", "output_tokens", "cached_tokens")
LIST_FIELDS = ("itl_s", "client_itl_s")
FIELD_NAMES: tuple[str, ...] = (
    "request_id", "trace_id", "timestamp", "tier", "model", "route", "outcome", "status_code",
    "stream", "input_tokens", "output_tokens", "cached_tokens", "tokens_source", "e2e_s",
    "ttft_s", "tpot_s", "itl_s", "network_s", "queue_s", "prefill_s", "queue_prefill_s",
    "decode_s", "detokenize_s", "other_s", "client_ttft_s", "client_e2e_s", "client_tpot_s", "client_itl_s",
)  # fmt: skip
_DEFAULTS: dict[str, Any] = {"model": "", "route": "", "outcome": "ok", "status_code": 200,
                             "stream": False, "input_tokens": 0, "output_tokens": 0,
                             "cached_tokens": 0}  # fmt: skip


_INF = math.inf
_SECONDS_FIELDS = ("e2e_s", *OPTIONAL_FLOAT)


class RecordError(UsageError):
    """A record that cannot be read; the message names the file and line."""


def record_from_dict(data: Mapping[str, Any], where: str = "record") -> RequestRecord:
    """Validate one record (unknown keys are ignored, so newer writers stay readable)."""
    return RequestRecord(**validate_record(data, where))


def validate_record(data: Mapping[str, Any], where: str = "record") -> dict[str, Any]:
    """The checked values of one record as a plain dict with every field.

    Building a sqlmodel object costs ~100x more than this dict, so bulk paths (import,
    evaluation) stay with dicts.
    """
    if not isinstance(data, Mapping):
        raise RecordError(f"{where}: expected a JSON object, got {type(data).__name__}")

    def fail(name: str, expected: str) -> RecordError:
        value = data.get(name)
        shown = repr(value) if len(repr(value)) < 40 else repr(value)[:37] + "..."
        return RecordError(f"{where}: field {name!r}: expected {expected}, got {shown}")

    values: dict[str, Any] = {}
    for name in REQUIRED_STR + REQUIRED_FLOAT:
        if data.get(name) is None:
            raise RecordError(
                f"{where}: missing field {name!r}; every record needs "
                f"{', '.join(REQUIRED_STR + REQUIRED_FLOAT)}"
            )
    for name in REQUIRED_STR + OPTIONAL_STR:
        value = data.get(name, _DEFAULTS.get(name))
        if value is not None and not isinstance(value, str):
            raise fail(name, "a string")
        values[name] = value
    if values["outcome"] not in OUTCOMES:
        raise fail("outcome", f"one of {', '.join(OUTCOMES)}")
    if values["tokens_source"] not in (None, *TOKENS_SOURCES):
        raise fail("tokens_source", f"one of {', '.join(TOKENS_SOURCES)}")
    timestamp = data["timestamp"]
    if type(timestamp) not in (int, float) or not -_INF < timestamp < _INF:
        raise fail("timestamp", "a finite number of unix seconds")
    values["timestamp"] = float(timestamp)
    for name in _SECONDS_FIELDS:
        value = data.get(name)
        # `type(...) in` and one chained comparison: this loop runs for every imported record.
        # NaN fails the comparison, bool is not int here.
        if value is not None and (type(value) not in (int, float) or not 0 <= value < _INF):
            raise fail(name, "a finite number of seconds >= 0")
        values[name] = None if value is None else float(value)
    for name in INT_FIELDS:
        value = data.get(name, _DEFAULTS[name])
        if type(value) is not int or value < 0:
            raise fail(name, "a whole number >= 0")
        values[name] = value
    stream = data.get("stream", False)
    if type(stream) is not bool:
        raise fail("stream", "true or false")
    values["stream"] = stream
    for name in LIST_FIELDS:
        value = data.get(name)
        if value is not None and (
            type(value) is not list
            or not all(type(v) in (int, float) and 0 <= v < _INF for v in value)
        ):
            raise fail(name, "a list of numbers of seconds >= 0")
        values[name] = None if value is None else [float(v) for v in value]
    return values


def parse_json_line(line: str | bytes, where: str) -> dict[str, Any]:
    """One JSONL line -> validated values; errors name `where` (file:line)."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = (
            f"{error.msg} at column {error.colno}"
            if isinstance(error, json.JSONDecodeError)
            else "not UTF-8"
        )
        raise RecordError(
            f"{where}: not valid JSON ({reason}); each line must be one JSON object"
        ) from None
    return validate_record(data, where)


def iter_jsonl(path: str | Path) -> Iterator[RequestRecord]:
    """Records of a JSONL file, one per non-blank line, validated."""
    for values in iter_jsonl_dicts(path):
        yield RequestRecord(**values)


def iter_jsonl_dicts(path: str | Path) -> Iterator[dict[str, Any]]:
    """Validated values of each non-blank line of a JSONL file."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as error:
        raise RecordError(f"{path}: cannot open ({error.strerror})") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield parse_json_line(line, f"{path}:{number}")


def read_jsonl(path: str | Path) -> list[RequestRecord]:
    return list(iter_jsonl(path))


def write_jsonl(records: Iterable[RequestRecord], path: str | Path) -> int:
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.to_json_line())
            handle.write("\n")
            count += 1
    return count
