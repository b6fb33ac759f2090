"""The bundled engine honours logit bias, OpenAI's penalties and seeds end to end: each checked
against its documented definition on the tiny checkpoint, not against recorded outputs."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, EngineConfig  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

MODEL = "bundled:tiny"
PROMPT = "Once upon a time"


def _engine(device: str = "cpu") -> Engine:
    return Engine.from_pretrained(MODEL, EngineConfig(device=device, max_model_len=256))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = _engine()
    engine.start_sync()
    yield engine
    asyncio.run(engine.stop())


def generate(engine: Engine, prompt: str | list[int], params: SamplingParams) -> list[int]:
    async def run() -> list[int]:
        ids: list[int] = []
        async for output in engine.generate(prompt, params):
            ids += output.token_ids
        return ids

    return asyncio.run(run())


def greedy(tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frequency", "presence"), [(0.5, 0.0), (0.0, 1.0), (0.3, 0.4), (-0.5, 0.0)]
)
def test_penalised_greedy_tokens_are_the_argmax_of_the_penalised_logits(
    engine: Engine, frequency: float, presence: float
) -> None:
    """Step by step: token t is what greedy picks after the prompt and tokens < t when each
    token's logit drops by frequency * count + presence * (count > 0): the same penalty
    written as a logit bias on a one-token request."""
    prompt = engine.encode_prompt(PROMPT)
    tokens = generate(
        engine, prompt, greedy(16, frequency_penalty=frequency, presence_penalty=presence)
    )
    assert len(tokens) == 16
    for step in range(1, len(tokens)):
        counts = Counter(tokens[:step])
        bias = tuple((token, -(count * frequency + presence)) for token, count in counts.items())
        expected = generate(engine, prompt + tokens[:step], greedy(1, logit_bias=bias))
        assert expected == [tokens[step]], f"step {step}"


def test_penalties_change_repetition_the_documented_way(engine: Engine) -> None:
    plain = Counter(generate(engine, PROMPT, greedy(32)))
    assert plain.most_common(1)[0][1] >= 8  # the tiny model repeats itself when greedy
    penalised = Counter(generate(engine, PROMPT, greedy(32, frequency_penalty=2.0)))
    assert penalised.most_common(1)[0][1] < plain.most_common(1)[0][1]
    assert len(penalised) > len(plain)
    present = Counter(generate(engine, PROMPT, greedy(32, presence_penalty=2.0)))
    assert len(present) > len(plain)
    rewarded = Counter(generate(engine, PROMPT, greedy(32, presence_penalty=-2.0)))
    assert rewarded.most_common(1)[0][1] > plain.most_common(1)[0][1]


def test_logit_bias_bans_and_forces(engine: Engine) -> None:
    first = generate(engine, PROMPT, greedy(8))[0]
    banned = generate(engine, PROMPT, greedy(8, logit_bias=((first, -100.0),)))
    assert first not in banned
    forced = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True,
                            logit_bias=((ord("a"), 100.0),))  # fmt: skip
    assert generate(engine, PROMPT, forced) == [ord("a")] * 8  # byte-level vocabulary


def _seeded(engine: Engine, seed: int) -> list[int]:
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)
    return generate(engine, PROMPT, params)


def test_seed_reproducible_within_an_engine_and_different_seeds_differ(engine: Engine) -> None:
    assert _seeded(engine, 11) == _seeded(engine, 11)
    assert _seeded(engine, 11) != _seeded(engine, 12)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_seed_reproducible_across_engines(device: str) -> None:
    """Two engines loaded apart (a restart) draw the same text for the same seed."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    runs = []
    for _ in range(2):
        engine = _engine(device)
        engine.start_sync()
        try:
            runs.append((_seeded(engine, 1234), _seeded(engine, 99)))
        finally:
            asyncio.run(engine.stop())
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]


def test_speculative_engine_refuses_bias_and_penalties() -> None:
    """The draft-and-verify step would drop them: a 400 naming the field at the API, a
    ValueError for a direct caller of the engine."""
    from engine.api.schema import ApiError, parse_chat

    speculative = Engine.from_pretrained(
        MODEL, EngineConfig(max_model_len=256, draft_model=MODEL, num_speculative_tokens=2)
    )
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for name, value in (("logit_bias", {"97": 5}), ("presence_penalty", 0.5)):
        with pytest.raises(ApiError) as caught:
            parse_chat({**chat, name: value}, speculative)
        assert caught.value.status == 400 and caught.value.param == name
    assert parse_chat({**chat, "seed": 3, "presence_penalty": 0}, speculative).params.seed == 3

    async def submit() -> None:
        speculative.submit("hi", greedy(4, frequency_penalty=1.0))

    with pytest.raises(ValueError, match="speculative decoding"):
        asyncio.run(submit())
    asyncio.run(speculative.stop())
