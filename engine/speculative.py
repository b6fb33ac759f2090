"""Speculative decoding with a draft model (Leviathan et al., 2023; Chen et al., 2023).

Each decode step the draft proposes up to k tokens per sequence, one cheap forward per token,
and the target scores all of them in a single forward of k+1 tokens per sequence through the
same paged attention as prefill. Tokens are accepted left to right:

- greedy requests keep a draft token while it equals the target's argmax, then take the
  target's argmax at the first mismatch (or after the last draft token): the output is the
  plain greedy output, token for token;
- sampled requests keep draft token x with probability min(1, p(x) / q(x)) (p: target, q:
  draft, both after temperature, top-k and top-p); at the first rejection they sample from
  the residual max(0, p - q), normalized; when every draft token is kept they sample a bonus
  token from p. Each emitted token is then distributed exactly as under plain sampling.

Rejected positions need no rollback: the sequence's cached length simply does not count them,
and the next step writes over their cache slots. The draft keeps its own paged cache with the
same block ids as the target, so a prefix-cached block carries both models' keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.runner import run_tokens
from engine.sampling import SamplingParams, probabilities
from engine.sequence import Sequence


@dataclass
class SpeculativeStep:
    """What one speculative step produced: tokens per sequence (accepted drafts, then one
    token from the target), and how many draft tokens were proposed and accepted."""

    tokens: list[list[int]]
    draft_tokens: int
    accepted_tokens: int


def accept_tokens(
    draft_tokens: list[int],
    draft_probs: list[torch.Tensor] | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """The accept/resample rule for one sequence; `target_logits` is [len(draft)+1, vocab]."""
    if params.greedy:
        choices = target_logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for index, token in enumerate(draft_tokens):
            out.append(choices[index])
            if token != choices[index]:
                return out
        out.append(choices[len(draft_tokens)])
        return out
    assert draft_probs is not None
    target_probs = probabilities(target_logits, params)
    out = []
    for index, token in enumerate(draft_tokens):
        p, q = target_probs[index], draft_probs[index]
        draw = torch.rand((), generator=generator, device=p.device)
        # Accept iff draw < p/q, written without a division: q(token) > 0, it was sampled.
        if bool(draw * q[token] < p[token]):
            out.append(token)
            continue
        residual = torch.clamp(p - q, min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: fall back to p itself
            residual = p
        out.append(int(torch.multinomial(residual, 1, generator=generator).item()))
        return out
    bonus = target_probs[len(draft_tokens)]
    out.append(int(torch.multinomial(bonus, 1, generator=generator).item()))
    return out


class SpeculativeDecoder:
    """Owns the draft model and its cache; `step` replaces the plain decode forward."""

    def __init__(
        self,
        draft: LlamaForCausalLM,
        draft_cache: PagedKVCache,
        num_speculative_tokens: int,
        default_generator: torch.Generator,
    ) -> None:
        self.draft = draft
        self.cache = draft_cache
        self.num_speculative_tokens = num_speculative_tokens
        self.default_generator = default_generator

    def prefill(self, sequences: list[Sequence]) -> None:
        """Give the draft the keys and values of what the target just prefilled."""
        pending = [s for s in sequences if s.draft_cached < s.num_cached]
        if pending:
            run_tokens(
                self.draft,
                self.cache,
                [s.block_table for s in pending],
                [s.draft_cached for s in pending],
                [s.all_ids[s.draft_cached : s.num_cached] for s in pending],
            )
            for sequence in pending:
                sequence.draft_cached = sequence.num_cached

    def _propose(
        self, sequences: list[Sequence], lookaheads: list[int]
    ) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Up to `lookaheads[i]` draft tokens per sequence, with the draft's distributions."""
        proposed: list[list[int]] = [[] for _ in sequences]
        draft_probs: list[list[torch.Tensor]] = [[] for _ in sequences]
        # The first round feeds what the draft has not seen yet: usually the newest token,
        # two tokens after a step that accepted every draft token.
        feeds = {i: s.all_ids[s.draft_cached :] for i, s in enumerate(sequences)}
        for _ in range(max(lookaheads, default=0)):
            rows = [i for i, count in enumerate(lookaheads) if len(proposed[i]) < count]
            if not rows:
                break
            logits = run_tokens(
                self.draft,
                self.cache,
                [sequences[i].block_table for i in rows],
                [sequences[i].draft_cached for i in rows],
                [feeds[i] for i in rows],
            )
            for row, i in enumerate(rows):
                sequence = sequences[i]
                sequence.draft_cached += len(feeds[i])
                last = logits[row, len(feeds[i]) - 1]
                if sequence.params.greedy:
                    token = int(last.argmax())
                else:
                    q = probabilities(last, sequence.params)
                    generator = sequence.generator or self.default_generator
                    token = int(torch.multinomial(q, 1, generator=generator).item())
                    draft_probs[i].append(q)
                proposed[i].append(token)
                feeds[i] = [token]
        return proposed, draft_probs

    def step(
        self, target: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]
    ) -> SpeculativeStep:
        """Propose, verify in one target forward, accept; updates both cached lengths."""
        lookaheads = [s.lookahead(self.num_speculative_tokens) for s in sequences]
        proposed, draft_probs = self._propose(sequences, lookaheads)
        starts = [s.num_cached for s in sequences]
        logits = run_tokens(
            target,
            cache,
            [s.block_table for s in sequences],
            starts,
            [
                s.all_ids[s.num_cached :] + drafts
                for s, drafts in zip(sequences, proposed, strict=True)
            ],
        )
        tokens: list[list[int]] = []
        accepted_total = 0
        for row, sequence in enumerate(sequences):
            drafts = proposed[row]
            fed = sequence.num_tokens - sequence.num_cached + len(drafts)
            # The verification logits of this row: the one after the newest real token, then
            # one after each draft token.
            rows = logits[row, fed - len(drafts) - 1 : fed]
            out = accept_tokens(
                drafts,
                draft_probs[row],
                rows,
                sequence.params,
                sequence.generator or self.default_generator,
            )
            accepted = len(out) - 1
            accepted_total += accepted
            old_tokens = sequence.num_tokens
            # Valid target keys: everything fed up to and including the accepted drafts.
            sequence.num_cached = old_tokens + accepted
            # The draft saw its own tokens except the last one proposed.
            sequence.draft_cached = min(sequence.draft_cached, old_tokens + accepted)
            tokens.append(out)
        return SpeculativeStep(tokens, sum(len(d) for d in proposed), accepted_total)
