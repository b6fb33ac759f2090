"""Workloads people actually have: a replayed trace, and multi-turn sessions.

Trace replay reads JSONL, one request a line. The public Mooncake trace format is read as is
(github.com/kvcache-ai/Mooncake, FAST'25 traces):

    {"timestamp": 3052, "input_length": 7234, "output_length": 794, "hash_ids": [0, 28, 29]}

`timestamp` in milliseconds since the first request (or `timestamp_s` in seconds),
`input_length` / `output_length` in tokens (or `input_tokens` / `output_tokens`), an optional
`tier`, and optional `hash_ids`: one id per block of `block_tokens` (512 in Mooncake) prompt
tokens, equal ids meaning an equal block, so requests that shared a prefix in the trace share
one here (and a prefix cache sees it). `scale` multiplies the rate: timestamps are divided by it.

Multi-turn sessions: each session's turns are one conversation whose every prompt starts with
all of the previous turns (the growing shared prefix a chat sends), sessions starting at
Poisson times and turns following after a think time.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slo.errors import UsageError

MOONCAKE_BLOCK_TOKENS = 512
_WORD_TEXT = (
    "the of and to in is that for it as with was on be by at this from or have an they which "
    "one you were all we when there can more if out so what time up about into than them"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class TraceRequest:
    offset_s: float
    input_tokens: int
    output_tokens: int
    tier: str | None
    prompt: str


def _block_text(block_id: int, chars: int) -> str:
    """The same text for the same block id, in every request that names it."""
    rng = random.Random(block_id * 7919 + 17)
    parts: list[str] = [f"<{block_id}>"]
    length = len(parts[0])
    while length < chars:
        word = rng.choice(_WORDS)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)[:chars] + " "


def _number(entry: dict[str, Any], keys: tuple[str, ...], where: str) -> float:
    for key in keys:
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    raise UsageError(f"{where}: needs {' or '.join(repr(k) for k in keys)} as a number >= 0")


def _prompt(
    entry: dict[str, Any], index: int, tokens: int, chars_per_token: float, block_tokens: int
) -> str:
    chars = max(1, int(tokens * chars_per_token))
    ids = entry.get("hash_ids")
    if not isinstance(ids, list) or not ids:
        return (f"[{index}] " + _block_text(-index - 1, chars))[:chars]
    block_chars = max(1, int(block_tokens * chars_per_token))
    text = "".join(_block_text(int(block_id), block_chars - 1) for block_id in ids)
    return text[:chars]


def read_trace(
    path: str | Path,
    *,
    scale: float = 1.0,
    chars_per_token: float = 1.0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    max_model_len: int | None = None,
) -> list[TraceRequest]:
    """The trace's requests in time order, offsets divided by `scale`."""
    if not scale > 0 or not math.isfinite(scale):
        raise UsageError(f"--trace-scale must be > 0, got {scale}")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"--trace {path}: cannot read ({error.strerror})") from None
    requests: list[TraceRequest] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not JSON ({error.msg})") from None
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: each line must be a JSON object")
        seconds = (
            _number(entry, ("timestamp_s",), where)
            if "timestamp_s" in entry
            else _number(entry, ("timestamp",), where) / 1000.0
        )
        tokens_in = int(_number(entry, ("input_length", "input_tokens"), where))
        tokens_out = max(1, int(_number(entry, ("output_length", "output_tokens"), where)))
        if max_model_len is not None and tokens_in + tokens_out > max_model_len:
            tokens_in = max(1, max_model_len - tokens_out)  # fitted to the target's context
        tier = entry.get("tier")
        prompt = _prompt(entry, len(requests), tokens_in, chars_per_token, block_tokens)
        requests.append(
            TraceRequest(float(seconds), tokens_in, tokens_out, str(tier) if tier else None, prompt)
        )
    if not requests:
        raise UsageError(f"--trace {path}: no requests in the file")
    start = min(request.offset_s for request in requests)
    ordered = sorted(requests, key=lambda request: request.offset_s)
    return [
        TraceRequest(
            (r.offset_s - start) / scale, r.input_tokens, r.output_tokens, r.tier, r.prompt
        )
        for r in ordered
    ]


def sessions(
    rng: random.Random,
    count: int,
    turns: int,
    *,
    rate: float,
    think_s: float,
    turn_tokens: int,
    output_tokens: int,
    chars_per_token: float = 1.0,
) -> list[TraceRequest]:
    """`count` conversations of `turns` turns: sessions start at Poisson times at `rate`
    sessions/s; turn k is sent think_s after turn k-1 was planned, and its prompt is every
    earlier turn (question and a stand-in of the answer) followed by a new question."""
    if turns < 1 or count < 1 or not rate > 0 or think_s < 0:
        raise UsageError("--sessions and --turns must be >= 1, the rate > 0, --think-time >= 0")
    requests: list[TraceRequest] = []
    start = 0.0
    for session in range(count):
        history = f"[session {session}] "
        for turn in range(turns):
            question = _block_text(rng.randrange(1 << 30), int(turn_tokens * chars_per_token))
            prompt = history + question
            tokens = round(len(prompt) / chars_per_token)
            requests.append(
                TraceRequest(start + turn * think_s, tokens, output_tokens, None, prompt)
            )
            answer = _block_text(rng.randrange(1 << 30), int(output_tokens * chars_per_token))
            history = prompt + answer
        start += rng.expovariate(rate)
    return sorted(requests, key=lambda request: request.offset_s)
