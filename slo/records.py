"""One `RequestRecord` per finished request: ids, tier, outcome, tokens and every timing.

Never any prompt or completion text. The same record travels as a database row (sqlmodel),
as a dict and as one JSONL line (the format `slo bench` writes and `slo check --results`
reads). Validation errors name the file and line: `run.jsonl:12: field 'e2e_s': ...`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Column
from sqlmodel import Field, SQLModel

from slo.engine_slis import DELAY_CAUSES
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
    # Server view, seconds. The breakdown adds up: the phases of slo.sli.PHASES sum to e2e.
    # Phases stay None where no engine reported them.
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
    # Where the clock started: "first_byte" (the server told the request's first byte) or
    # "asgi_call"; from the first byte to the app (a part of network), and from accepting a new
    # connection to its first request's first byte (not in e2e).
    clock_start: str | None = None
    before_app_s: float | None = None
    connection_s: float | None = None
    # Client view, filled by `slo bench`: what the person waiting actually saw.
    client_ttft_s: float | None = None
    client_e2e_s: float | None = None
    client_tpot_s: float | None = None
    client_itl_s: list[float] | None = Field(default=None, sa_column=Column(JSON))
    # Who made it wait (the bundled engine's exact blame, docs/blame.md): its queue wait,
    # preemptions and decode interference, each tier's share and the top culprits; bounded.
    delay_blame: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))

    def to_dict(self) -> dict[str, Any]:
        """Every field but the database id, None values left out."""
        return {
            name: getattr(self, name) for name in FIELD_NAMES if getattr(self, name) is not None
        }

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _field_groups() -> dict[str, tuple[str, ...]]:
    """Every field of RequestRecord but the database id, grouped by how it is validated.

    Derived from the model once, at import, so a field added to it is validated, written and
    read everywhere; a field of a type `validate_record` cannot check stops the import.
    """
    kinds: dict[Any, str] = {
        str: "str",
        str | None: "str",
        float: "float",
        float | None: "float",
        int: "int",
        bool: "bool",
        list[float] | None: "list",
        dict[str, Any] | None: "blame",
    }
    groups: dict[str, list[str]] = {}
    for name, info in RequestRecord.model_fields.items():
        if name == "id":
            continue
        kind = kinds.get(info.annotation)
        if kind is None:
            known = ", ".join(getattr(type_, "__name__", str(type_)) for type_ in kinds)
            raise TypeError(
                f"slo/records.py: RequestRecord.{name} is {info.annotation}; validate_record "
                f"checks {known}: use one of them or teach validate_record the new type"
            )
        required = "required" if info.is_required() else "optional"
        groups.setdefault("all", []).append(name)
        groups.setdefault(kind, []).append(name)
        groups.setdefault(f"{required} {kind}", []).append(name)
    return {group: tuple(names) for group, names in groups.items()}


_GROUPS = _field_groups()
FIELD_NAMES: tuple[str, ...] = _GROUPS["all"]
REQUIRED_STR: tuple[str, ...] = _GROUPS.get("required str", ())
OPTIONAL_STR: tuple[str, ...] = _GROUPS.get("optional str", ())
REQUIRED_FLOAT: tuple[str, ...] = _GROUPS.get("required float", ())
OPTIONAL_FLOAT: tuple[str, ...] = _GROUPS.get("optional float", ())
INT_FIELDS: tuple[str, ...] = _GROUPS.get("int", ())
BOOL_FIELDS: tuple[str, ...] = _GROUPS.get("bool", ())
LIST_FIELDS: tuple[str, ...] = _GROUPS.get("list", ())
BLAME_FIELDS: tuple[str, ...] = _GROUPS.get("blame", ())
# Defaults a dict may leave out (None defaults need no entry: a missing key reads as None).
_DEFAULTS: dict[str, Any] = {
    name: info.default
    for name, info in RequestRecord.model_fields.items()
    if name in FIELD_NAMES and not info.is_required() and info.default is not None
}


_INF = math.inf
# Every float but the timestamp is a duration in seconds.
_SECONDS_FIELDS = tuple(name for name in _GROUPS.get("float", ()) if name != "timestamp")


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
        value = data.get(name, _DEFAULTS.get(name))
        if type(value) is not int or value < 0:
            raise fail(name, "a whole number >= 0")
        values[name] = value
    for name in BOOL_FIELDS:
        value = data.get(name, _DEFAULTS.get(name))
        if type(value) is not bool:
            raise fail(name, "true or false")
        values[name] = value
    _check_json_fields(data, values, fail)
    return values


def _check_json_fields(
    data: Mapping[str, Any], values: dict[str, Any], fail: Callable[[str, str], RecordError]
) -> None:
    """The lists of gaps and the delay blame, into `values` (`validate_record`)."""
    for name in LIST_FIELDS:
        value = data.get(name)
        if value is not None and (
            type(value) is not list
            or not all(type(v) in (int, float) and 0 <= v < _INF for v in value)
        ):
            raise fail(name, "a list of numbers of seconds >= 0")
        values[name] = None if value is None else [float(v) for v in value]
    for name in BLAME_FIELDS:
        value = data.get(name)
        if value is not None and not _is_blame(value):
            raise fail(name, "a delay blame object (docs/blame.md)")
        values[name] = value


# A delay blame's totals, in seconds (the engine's `RequestBlame` has the same attributes).
BLAME_TOTALS = ("queue_s", "preempted_s", "decode_s", "decode_only_s", "interference_s")
_BLAME_ENTRY_KEYS = {
    "by_tier": {"cause", "tier", "s", "requests"},
    "top": {"cause", "request_id", "tier", "s"},
}
MAX_BLAME_ENTRIES = 256  # by_tier: a cause per tier pair; more is not a blame this engine wrote
TOP_CULPRITS = 3  # engine.blame.TOP_CULPRITS (tests/unit/engine/test_blame.py compares them)


def _is_seconds(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value < _INF


def _is_blame(value: Any) -> bool:
    """A `delay_blame` object: its totals in seconds, each tier's share (`by_tier`) and the
    top culprits (`top`, at most TOP_CULPRITS), each naming a cause of DELAY_CAUSES."""
    if type(value) is not dict or set(value) - {"estimated"} != {*BLAME_TOTALS, *_BLAME_ENTRY_KEYS}:
        return False
    if type(value.get("estimated", False)) is not bool:  # estimated in front of any engine
        return False
    if not all(_is_seconds(value[total]) for total in BLAME_TOTALS):
        return False
    for key, limit in (("by_tier", MAX_BLAME_ENTRIES), ("top", TOP_CULPRITS)):
        entries = value[key]
        if type(entries) is not list or len(entries) > limit:
            return False
        for entry in entries:
            if type(entry) is not dict or set(entry) != _BLAME_ENTRY_KEYS[key]:
                return False
            if entry["cause"] not in DELAY_CAUSES or type(entry["tier"]) is not str:
                return False
            if not _is_seconds(entry["s"]):
                return False
            if key == "by_tier" and (type(entry["requests"]) is not int or entry["requests"] < 0):
                return False
            if key == "top" and type(entry["request_id"]) is not str:
                return False
    return True


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
