"""Profiles and plans of `slo bench`: seeded, fitted to the context, tiers and arrivals as asked."""

from __future__ import annotations

import itertools
import statistics

import pytest

from slo.cli.bench.profiles import (
    PROFILES,
    TEMPLATE_MARGIN_TOKENS,
    get_profile,
    parse_tier_mix,
    plan_requests,
)
from slo.errors import UsageError


def plan(profile: str = "chat", count: int = 200, **overrides: object) -> list:
    arguments: dict = {"seed": 7, "max_model_len": 1024, "rate": 4.0, **overrides}
    return plan_requests(get_profile(profile), count, **arguments)


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    assert plan() == plan()
    other = plan(seed=8)
    assert [p.prompt for p in other] != [p.prompt for p in plan()]
    assert [p.offset_s for p in other] != [p.offset_s for p in plan()]


@pytest.mark.parametrize("name", list(PROFILES))
@pytest.mark.parametrize("context", [128, 1024, 32768])
def test_every_request_fits_the_context(name: str, context: int) -> None:
    for planned in plan(name, 300, max_model_len=context):
        assert planned.input_tokens + planned.max_tokens <= context - TEMPLATE_MARGIN_TOKENS
        assert planned.max_tokens >= 1 and planned.input_tokens >= 1
        # one character per planned token: exact for byte-level tokenizers
        assert len(planned.prompt) <= planned.input_tokens


def test_a_small_context_shrinks_the_profile_and_a_large_one_keeps_it() -> None:
    small = statistics.median(p.input_tokens for p in plan("rag", 300, max_model_len=1024))
    large = statistics.median(p.input_tokens for p in plan("rag", 300, max_model_len=32768))
    assert small < 700 < 2000 < large  # rag's median prompt is ~3000 tokens at full size


def test_profiles_differ_where_their_use_cases_do() -> None:
    def median_input(name: str) -> float:
        return statistics.median(p.input_tokens for p in plan(name, 300, max_model_len=32768))

    assert median_input("voice") < median_input("chat") < median_input("rag")
    assert get_profile("code").endpoint == "completions"
    assert get_profile("batch").arrival == "concurrency"


def test_poisson_arrivals_have_the_asked_mean_gap_and_closed_loop_none() -> None:
    offsets = [p.offset_s for p in plan(count=2000, rate=5.0)]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert all(gap >= 0 for gap in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.1)
    # exponential gaps: the standard deviation equals the mean (a fixed pace would give 0)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.15)
    assert {p.offset_s for p in plan(rate=None)} == {0.0}


def test_tiers_follow_the_mix() -> None:
    mix = parse_tier_mix("premium=2,standard=7,batch=1")
    assert mix == (("premium", 0.2), ("standard", 0.7), ("batch", 0.1))
    tiers = [p.tier for p in plan(count=3000, tier_mix=mix)]
    assert tiers.count("premium") / 3000 == pytest.approx(0.2, abs=0.03)
    assert tiers.count("batch") / 3000 == pytest.approx(0.1, abs=0.03)
    assert {p.tier for p in plan(count=50)} == {"standard"}  # the chat profile's default


def test_prompts_do_not_share_a_prefix() -> None:
    prompts = [p.prompt for p in plan(count=50)]
    assert len({prompt[:6] for prompt in prompts}) == 50


@pytest.mark.parametrize("text", ["premium", "premium=x", "=1", "premium=-1", "a=0", ""])
def test_bad_tier_mixes_say_how_to_write_one(text: str) -> None:
    with pytest.raises(UsageError, match="--tier-mix"):
        parse_tier_mix(text)


def test_unknown_profile_and_tiny_context_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="use one of chat, code, rag, batch, voice"):
        get_profile("chatty")
    with pytest.raises(UsageError, match="too small"):
        plan(max_model_len=40)
