"""Traffic profiles for `slo bench`: who asks what, how long the replies are, how requests arrive.

A profile's lengths are written for a model with an 8k-token context and shrunk, when the
target's context (`max_model_len` from `/v1/models`) is smaller, so that the longest prompt
plus the longest reply still fit. Everything random comes from one `random.Random(seed)`, so
the same seed against the same context gives the same prompts, lengths, tiers and arrival
times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from slo.capacity.arrivals import ArrivalKind, next_gap
from slo.errors import UsageError
from slo.tier_numbers import parse_tier_numbers

Endpoint = Literal["chat", "completions"]
Arrival = Literal["poisson", "concurrency"]

# Room left for the chat template and BOS on top of the sampled prompt.
TEMPLATE_MARGIN_TOKENS = 48
REFERENCE_CONTEXT = 8192


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Log-normal token counts around `median`, clipped to [low, high] (at 8k context)."""

    median: int
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random, scale: float) -> int:
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        value = min(max(value, self.low), self.high)
        return max(1, round(value * scale))


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    endpoint: Endpoint
    input: LengthDist
    output: LengthDist
    arrival: Arrival
    rate: float  # default Poisson rate, requests/s (when arrival is poisson)
    concurrency: int  # default closed-loop concurrency (when arrival is concurrency)
    tier_mix: tuple[tuple[str, float], ...]

    def scale_for(self, max_model_len: int) -> float:
        """Shrink factor so the longest prompt + reply fit the context (1.0 when they do)."""
        room = max_model_len - TEMPLATE_MARGIN_TOKENS
        if room < 8:
            raise UsageError(
                f"max_model_len {max_model_len} is too small to benchmark; need at least "
                f"{TEMPLATE_MARGIN_TOKENS + 8} tokens"
            )
        return min(1.0, room / (self.input.high + self.output.high))


# Lengths and arrivals after the use cases they name: ShareGPT-like chat, code completion
# with file context, retrieval-augmented answers over long contexts, offline batch jobs that
# saturate the server, and voice assistants that need the first words fast and say little.
PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="chat",
            description="conversational turns, ShareGPT-like lengths, Poisson arrivals",
            endpoint="chat",
            input=LengthDist(600, 0.7, 32, 2048),
            output=LengthDist(200, 0.6, 16, 1024),
            arrival="poisson",
            rate=4.0,
            concurrency=8,
            tier_mix=(("standard", 1.0),),
        ),
        Profile(
            name="code",
            description="code completion: medium file context, short completions",
            endpoint="completions",
            input=LengthDist(1200, 0.5, 128, 3072),
            output=LengthDist(64, 0.6, 8, 256),
            arrival="poisson",
            rate=6.0,
            concurrency=8,
            tier_mix=(("standard", 1.0),),
        ),
        Profile(
            name="rag",
            description="retrieval-augmented answers: long prompts, medium replies",
            endpoint="chat",
            input=LengthDist(3000, 0.35, 1024, 6144),
            output=LengthDist(180, 0.5, 32, 512),
            arrival="poisson",
            rate=1.0,
            concurrency=4,
            tier_mix=(("standard", 1.0),),
        ),
        Profile(
            name="batch",
            description="offline jobs: closed-loop at fixed concurrency, long replies",
            endpoint="completions",
            input=LengthDist(800, 0.6, 64, 2048),
            output=LengthDist(400, 0.5, 64, 1024),
            arrival="concurrency",
            rate=2.0,
            concurrency=16,
            tier_mix=(("batch", 1.0),),
        ),
        Profile(
            name="voice",
            description="voice assistant: short turns, first words fast",
            endpoint="chat",
            input=LengthDist(120, 0.5, 16, 400),
            output=LengthDist(40, 0.5, 8, 150),
            arrival="poisson",
            rate=3.0,
            concurrency=8,
            tier_mix=(("premium", 1.0),),
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(
            f"--profile {name!r}: unknown profile; use one of {', '.join(PROFILES)}"
        ) from None


def parse_tier_mix(text: str) -> tuple[tuple[str, float], ...]:
    """'premium=0.2,standard=0.7,batch=0.1' -> normalized weights (they need not sum to 1)."""
    form = "TIER=WEIGHT; write e.g. premium=0.2,standard=0.8"
    mix = parse_tier_numbers(text, "--tier-mix", form)
    total = sum(weight for _, weight in mix)
    if not mix or total <= 0:
        raise UsageError("--tier-mix: give at least one tier with a weight > 0")
    return tuple((name, weight / total) for name, weight in mix)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    tier: str
    prompt: str
    input_tokens: int  # what the plan asked for; the server's usage says what it got
    max_tokens: int
    offset_s: float  # when to send, seconds after the run starts (Poisson); 0 in closed loop


# Common English words: prompts that look like text to any tokenizer.
_WORD_TEXT = (
    "the of and to in is that for it as with was on be by at this from or have an they which "
    "one you were all we when there can more if out so what time up about into than them "
    "only other new some could these two may first then do any like now such make over our "
    "even most after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very world still "
    "own see men work long get here between both life being under never day same another know "
    "while last might great old year off come since against go came right used take three"
)
_WORDS = tuple(_WORD_TEXT.split())


def make_prompt(rng: random.Random, target_chars: int, index: int) -> str:
    """Words up to `target_chars` characters; the request index first so no two prompts share
    a prefix (a prefix cache would otherwise make later requests look faster than they are)."""
    parts = [f"[{index}]"]
    length = len(parts[0])
    while length < target_chars:
        word = rng.choice(_WORDS)
        parts.append(word)
        length += len(word) + 1
    text = " ".join(parts)
    return text[: max(target_chars, 1)]


def plan_requests(
    profile: Profile,
    count: int,
    *,
    seed: int,
    max_model_len: int,
    rate: float | None,
    tier_mix: tuple[tuple[str, float], ...] | None = None,
    chars_per_token: float = 1.0,
    arrival: ArrivalKind = "poisson",
    burstiness: float = 1.0,
) -> list[PlannedRequest]:
    """The whole run, decided up front: same arguments, same requests.

    `rate` None means closed loop (every offset 0; the runner's concurrency paces them);
    otherwise gaps follow `arrival` (`slo.capacity.arrivals`: constant, poisson, gamma).
    `chars_per_token` turns token counts into prompt characters: 1.0 is right for byte-level
    tokenizers and safe for all (a BPE tokenizer then sees ~4x fewer tokens than planned).
    """
    rng = random.Random(seed)
    scale = profile.scale_for(max_model_len)
    mix = tier_mix or profile.tier_mix
    names = [name for name, _ in mix]
    weights = [weight for _, weight in mix]
    room = max_model_len - TEMPLATE_MARGIN_TOKENS
    offset = 0.0
    planned: list[PlannedRequest] = []
    for index in range(count):
        input_tokens = profile.input.sample(rng, scale)
        output_tokens = profile.output.sample(rng, scale)
        output_tokens = max(1, min(output_tokens, room - 4))
        input_tokens = max(4, min(input_tokens, room - output_tokens))
        tier = rng.choices(names, weights)[0]
        if rate is not None and index > 0:
            offset += next_gap(rng, arrival, rate, burstiness)
        prompt = make_prompt(rng, max(1, int(input_tokens * chars_per_token)), index)
        planned.append(PlannedRequest(index, tier, prompt, input_tokens, output_tokens, offset))
    return planned
