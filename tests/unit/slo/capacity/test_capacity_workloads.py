"""Trace replay (the Mooncake format) and multi-turn sessions: timing, lengths, tiers and the
prefixes requests share."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from slo.capacity.workloads import read_trace, sessions
from slo.errors import UsageError
from tests.helpers.mooncake_trace import MOONCAKE, write_trace


def test_a_mooncake_trace_replays_in_time_order_and_scales(tmp_path: Path) -> None:
    requests = read_trace(write_trace(tmp_path, MOONCAKE))
    assert [r.offset_s for r in requests] == [0.0, 5.0, 10.535, 27.482]
    assert [(r.input_tokens, r.output_tokens) for r in requests][:2] == [(655, 52), (300, 8)]
    assert [r.tier for r in requests] == [None, None, "premium", None]
    doubled = read_trace(write_trace(tmp_path, MOONCAKE), scale=2.0)
    assert [r.offset_s for r in doubled] == [0.0, 2.5, 5.2675, 13.741]
    assert all(len(r.prompt) == r.input_tokens for r in requests)  # one char a token


def test_equal_hash_ids_give_equal_prefixes_and_other_ids_do_not(tmp_path: Path) -> None:
    first, other, second, third = read_trace(write_trace(tmp_path, MOONCAKE))
    # blocks 46 and 47 are 512 tokens each: the first 655 characters agree
    assert first.prompt == third.prompt
    assert second.prompt[:655] == first.prompt
    assert other.prompt[:50] != first.prompt[:50]


def test_a_trace_is_fitted_to_the_context(tmp_path: Path) -> None:
    requests = read_trace(write_trace(tmp_path, MOONCAKE[:1]), max_model_len=300)
    assert (requests[0].input_tokens, requests[0].output_tokens) == (248, 52)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", r"trace.jsonl:1: not JSON"),
        ("[1, 2]", "trace.jsonl:1: each line must be a JSON object"),
        ('{"timestamp": 0, "output_length": 3}', "needs 'input_length' or 'input_tokens'"),
        ('{"timestamp": -1, "input_length": 3, "output_length": 3}', "needs 'timestamp'"),
    ],
)
def test_a_bad_line_is_named_with_its_place(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UsageError, match=message):
        read_trace(path)


def test_sessions_share_a_growing_prefix() -> None:
    requests = sessions(
        random.Random(1), 3, 4, rate=2.0, think_s=0.5, turn_tokens=20, output_tokens=10
    )
    assert len(requests) == 12
    by_session: dict[str, list[str]] = {}
    for request in requests:
        by_session.setdefault(request.prompt.split("]")[0], []).append(request.prompt)
    assert len(by_session) == 3
    for prompts in by_session.values():
        for earlier, later in itertools.pairwise(prompts):
            assert later.startswith(earlier) and len(later) >= len(earlier) + 30
    # a session's turns follow one another after the think time
    for prompts in by_session.values():
        offsets = [r.offset_s for r in requests if r.prompt in prompts]
        assert [round(b - a, 9) for a, b in itertools.pairwise(offsets)] == [0.5] * 3
