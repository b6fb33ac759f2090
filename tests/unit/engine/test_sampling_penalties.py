"""The sampler's logit bias and OpenAI's presence and frequency penalties, on exact numbers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.sampling import (  # noqa: E402
    SamplingParams,
    adjust_logits,
    refuse_under_speculation,
    sample_tokens,
)


def test_no_adjustment_returns_the_same_tensor() -> None:
    logits = torch.zeros(2, 5)
    assert adjust_logits(logits, [SamplingParams(), SamplingParams()], [[1], [2]]) is logits


def test_frequency_and_presence_penalties_follow_openai_definition() -> None:
    # mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, c from generated text
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    adjusted = adjust_logits(logits, [params], [[3, 3, 3, 1]])
    assert adjusted.tolist() == [[1.0, 2.0 - 0.5 - 0.25, 3.0, 4.0 - 1.5 - 0.25]]
    assert logits.tolist() == [[1.0, 2.0, 3.0, 4.0]]  # the model's logits are not touched


def test_negative_penalties_favour_repetition() -> None:
    logits = torch.tensor([[1.0, 1.5]])
    params = SamplingParams(temperature=0, presence_penalty=-1.0)
    adjusted = adjust_logits(logits, [params], [[0]])
    assert sample_tokens(adjusted, [params], [None]) == [0]
    assert sample_tokens(logits, [params], [None]) == [1]


def test_logit_bias_bans_and_forces_greedy_and_sampled_picks() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    ban = SamplingParams(temperature=0, logit_bias=((0, -100.0),))
    force = SamplingParams(temperature=1.0, logit_bias=((2, 100.0),))
    plain = SamplingParams(temperature=0)
    adjusted = adjust_logits(logits, [ban, plain], [[], []])
    assert adjusted[0].tolist() == [-95.0, 0.0, 0.0] and adjusted[1].tolist() == [5.0, 0.0, 0.0]
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        forced = adjust_logits(logits[:1], [force], [[]])
        assert sample_tokens(forced, [force], [generator]) == [2]


def test_bias_for_an_id_past_the_vocabulary_is_dropped_for_direct_callers() -> None:
    logits = torch.zeros(1, 3)
    params = SamplingParams(logit_bias=((1, 2.0), (99, 5.0)))
    assert adjust_logits(logits, [params], [[]]).tolist() == [[0.0, 2.0, 0.0]]


def test_half_precision_logits_are_adjusted_in_float32() -> None:
    logits = torch.tensor([[1000.0, 1000.0]], dtype=torch.bfloat16)
    adjusted = adjust_logits(logits, [SamplingParams(logit_bias=((1, 0.25),))], [[]])
    assert adjusted.dtype == torch.float32 and adjusted.tolist() == [[1000.0, 1000.25]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty must be between -2 and 2"),
        ({"frequency_penalty": -3.0}, "frequency_penalty must be between -2 and 2"),
        ({"logit_bias": ((1, 101.0),)}, "logit_bias takes"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias takes"),
    ],
)
def test_out_of_range_params_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_speculative_decoding_refuses_what_it_would_drop() -> None:
    refuse_under_speculation(SamplingParams(seed=3, stop=("x",)))
    with pytest.raises(ValueError, match="speculative decoding"):
        refuse_under_speculation(SamplingParams(frequency_penalty=0.5))


def test_values_at_the_edge_of_float32_still_sample() -> None:
    """Found by schemathesis: top_p 5e-324 is 0 in float32 and dropped every token (NaN, a
    500); a temperature of 1e-30 made logits / temperature overflow to inf (NaN again)."""
    logits = torch.tensor([[0.5, 3.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    tiny_top_p = SamplingParams(temperature=1.0, top_p=5e-324)
    assert sample_tokens(logits, [tiny_top_p], [generator]) == [1]
    tiny_temperature = SamplingParams(temperature=1e-30)
    assert tiny_temperature.greedy and not SamplingParams(temperature=1e-5).greedy
    assert sample_tokens(logits, [tiny_temperature], [generator]) == [1]
