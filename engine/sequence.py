"""One request inside the engine: its tokens, its place in the KV cache and what was sent.

Its own module so that the scheduler and the policies both read it without importing each
other; it imports nothing at run time (the annotations name their types only for checkers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from engine.blame import SequenceBlame
    from engine.sampling import SamplingParams
    from engine.tokenizer import IncrementalDetokenizer


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int
    arrival: int
    detokenizer: IncrementalDetokenizer
    deliver: Callable[[Any], None]
    generator: torch.Generator | None = None
    # False: the caller hears of the first token and of the end, nothing in between.
    streaming: bool = True
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose keys and values are in the cache
    draft_cached: int = 0  # the same for the draft model's cache (speculative decoding)
    block_hashes: list[int] = field(default_factory=list)  # prefix hashes of full blocks
    prefix_hit_tokens: int = 0  # tokens found in the prefix cache at the last admission
    text: str = ""  # generated text so far
    sent_chars: int = 0  # how much of `text` has been handed to the caller
    sent_tokens: int = 0  # how many of `output_ids` have been handed to the caller
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival_ns: int = 0  # perf_counter_ns when enqueued: TTFT deadlines and aging count from it
    queued_ns: int = 0  # when it last joined the waiting queue (arrival, or its preemption)
    prefilled: bool = False  # every token up to the newest is in the cache: it decodes
    prefill_started: bool = False  # its first chunk since (re)admission has run
    last_decode_step: int = 0  # the scheduler step that last decoded it (slo: turns)
    blame: SequenceBlame | None = None  # who made it wait (engine/blame.py), while blame is on

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def order(self) -> tuple[int, int]:
        return (self.priority, self.arrival)

    def lookahead(self, num_speculative: int) -> int:
        """Draft tokens worth proposing: never past max_tokens (the last slot is the bonus)."""
        remaining = self.params.max_tokens - len(self.output_ids)
        return max(0, min(num_speculative, remaining - 1))
