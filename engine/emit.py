"""One sampled token to what the caller sees: stop checks, detokenizing, text held back."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from engine.outputs import RequestOutput
from engine.sampling import held_back_length, stop_string_hit
from engine.sequence import Sequence


def next_output(
    sequence: Sequence,
    token: int,
    eos_ids: Collection[int],
    by_event: dict[str, list[Callable[..., None]]],
) -> RequestOutput | None:
    """Append `token` to `sequence`, fire on_token and on_detokenize, and return the piece to
    hand over (`finish_reason` set if the token ended the request), or None when nothing is
    due: a request that does not stream hears of its first token and its end only."""
    params = sequence.params
    sequence.output_ids.append(token)
    token_ns = time.perf_counter_ns()
    for hook in by_event["on_token"]:
        hook(sequence.request_id, token_ns, len(sequence.output_ids) - 1)

    finish_reason = None
    if token in eos_ids and not params.ignore_eos:
        finish_reason = "stop"
    elif len(sequence.output_ids) >= params.max_tokens:
        finish_reason = "length"
    final = finish_reason is not None
    text_ids = sequence.all_ids[:-1] if finish_reason == "stop" else sequence.all_ids
    sequence.text += sequence.detokenizer.step(text_ids, final=final)
    detok_ns = time.perf_counter_ns()
    for hook in by_event["on_detokenize"]:
        hook(sequence.request_id, detok_ns, detok_ns - token_ns)

    cut = stop_string_hit(sequence.text, params.stop) if params.stop else None
    if cut is not None:
        sequence.text = sequence.text[:cut]
        finish_reason = "stop"
    if finish_reason is None and not sequence.streaming and len(sequence.output_ids) > 1:
        return None  # not streaming: the first token and the end, nothing in between
    if finish_reason is None:
        # Text that may be the start of a stop string waits until the next token decides.
        safe = len(sequence.text) - held_back_length(sequence.text, params.stop)
    else:
        safe = len(sequence.text)
    delta = sequence.text[sequence.sent_chars : safe]
    sequence.sent_chars = max(sequence.sent_chars, safe)
    sent_tokens, sequence.sent_tokens = sequence.sent_tokens, len(sequence.output_ids)
    return RequestOutput(
        request_id=sequence.request_id,
        text=delta,
        token_ids=tuple(sequence.output_ids[sent_tokens:]),
        finish_reason=finish_reason,
        prompt_tokens=len(sequence.prompt_ids),
        completion_tokens=len(sequence.output_ids),
    )
