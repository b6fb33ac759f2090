"""Sampling parameters and the token sampler: logit bias and OpenAI's presence and frequency
penalties first (they change greedy picks too), then greedy, or temperature, top-k, top-p and a
per-request seeded generator."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. `temperature` 0 (or below 1e-5) means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    # OpenAI's definitions: each logit drops by frequency_penalty times the times its token
    # was generated so far, and by presence_penalty once if it was (the prompt is not counted).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be between -2 and 2, got {getattr(self, name)}")
        if any(token < 0 or not -100 <= bias <= 100 for token, bias in self.logit_bias):
            raise ValueError("logit_bias takes token ids >= 0 and biases between -100 and 100")

    @property
    def adjusts_logits(self) -> bool:
        """Whether the logits change before sampling (bias or penalties)."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty)

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32 to inf and softmax gives NaN; the
        # distribution is one-hot anyway (vLLM's _SAMPLING_EPS is the same bound).
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def adjust_logits(
    logits: torch.Tensor, params: list[SamplingParams], generated: list[list[int]]
) -> torch.Tensor:
    """`logits` [rows, vocab] with each row's logit bias and penalties applied, `generated[row]`
    being the tokens that row's request produced so far. Unchanged (no copy) when no row asks."""
    rows = [row for row, row_params in enumerate(params) if row_params.adjusts_logits]
    if not rows:
        return logits
    adjusted = logits.float()  # a copy (logits come in the model's dtype): bias adds exactly
    if adjusted is logits:
        adjusted = logits.clone()
    vocab = adjusted.shape[-1]
    for row in rows:
        row_params = params[row]
        if row_params.logit_bias:
            # Ids past this model's vocabulary were refused at the API; dropped here for direct
            # callers of the engine rather than indexing out of range.
            pairs = [(token, bias) for token, bias in row_params.logit_bias if token < vocab]
            if pairs:
                ids = torch.tensor([token for token, _ in pairs], device=adjusted.device)
                biases = torch.tensor([bias for _, bias in pairs], device=adjusted.device)
                adjusted[row].index_add_(0, ids, biases)
        if generated[row] and (row_params.presence_penalty or row_params.frequency_penalty):
            ids = torch.tensor(generated[row], device=adjusted.device)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(adjusted.dtype)
            adjusted[row] -= counts * row_params.frequency_penalty
            adjusted[row] -= (counts > 0).to(adjusted.dtype) * row_params.presence_penalty
    return adjusted


def refuse_under_speculation(params: SamplingParams) -> None:
    """Raise ValueError for params a speculative engine cannot honour: its draft-and-verify step
    samples from the plain distributions and would silently drop a bias or a penalty."""
    if params.adjusts_logits:
        raise ValueError(
            "logit_bias and presence/frequency penalties are not applied with speculative "
            "decoding; leave them out, or serve without a draft model"
        )


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature, then top-k, then top-p.

    Works on a [vocab] row or a [rows, vocab] matrix (speculative decoding needs both the
    draft's and the target's distributions under the same rules).
    """
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        drop[..., 0] = False  # even when top_p underflows to 0 in float32
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    return torch.softmax(scores, dim=-1)


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Sample one token id from a [vocab] row of logits."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = probabilities(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token id for each row of `logits` [rows, vocab], under that row's params and
    generator. Greedy rows share one argmax over the batch and one read of the result."""
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(dim=-1).tolist()  # type: ignore[no-any-return]
    greedy_ids = logits.argmax(dim=-1).tolist() if any(greedy) else []
    return [
        int(greedy_ids[row]) if row_params.greedy else sample_token(logits[row], row_params, gen)
        for row, (row_params, gen) in enumerate(zip(params, generators, strict=True))
    ]


def stop_string_hit(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    hits = [index for stop in stops if (index := text.find(stop)) != -1]
    return min(hits) if hits else None


def held_back_length(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still grow into a stop string (not yet safe to send)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def sample_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generated: list[list[int]],
    generators: list[torch.Generator | None],
) -> list[int | Exception]:
    """`adjust_logits` then `sample_tokens` over the batch; should that fail, row by row, so a
    request whose parameters break sampling gets its error and the others their tokens."""
    try:
        return list(sample_tokens(adjust_logits(logits, params, generated), params, generators))
    except Exception:
        results: list[int | Exception] = []
        for row in range(len(params)):
            one = slice(row, row + 1)
            try:
                adjusted = adjust_logits(logits[one], params[one], generated[one])
                results.append(sample_tokens(adjusted, params[one], generators[one])[0])
            except Exception as error:
                results.append(error)
        return results
