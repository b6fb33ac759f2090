"""What to check and what usually fixes it, per phase of `slo.sli.PHASES`, for the runbooks.

A latency alert's `phase` label names the phase that grew most; its runbook opens at that
phase's section. Every phase has an entry: `guide()` fails loudly on one that has none, so a
phase added to the catalog cannot be left out of the runbooks.
"""

from __future__ import annotations

from dataclasses import dataclass

from slo.sli import PHASES


@dataclass(frozen=True)
class PhaseGuide:
    phase: str
    means: str  # what the phase measures, in one line
    check: tuple[str, ...]
    fix: tuple[str, ...]


_GUIDES: dict[str, PhaseGuide] = {
    g.phase: g
    for g in (
        PhaseGuide(
            "network",
            "receiving the request body and sending the rest of the response after the last "
            "token (normal: 10-50 ms)",
            (
                "a slow client or a client on a bad link (one client's requests only?)",
                "a proxy or load balancer buffering the stream (nginx `proxy_buffering`)",
                "TLS termination or a cross-region hop added on the way",
            ),
            (
                "turn proxy buffering off for streamed routes",
                "serve clients from their region",
                "nothing in the engine: say so on the incident and hand it to the network owners",
            ),
        ),
        PhaseGuide(
            "queue",
            "waiting for a batch slot, preemptions included",
            (
                "the request rate per tier against last week",
                "queue depth per replica: one hot "
                "replica (load balancing) or all of them (capacity)",
                "preemptions: a KV cache that runs full sends running requests back to the queue",
            ),
            (
                "add replicas or shed the lowest tier (admission control)",
                "lower `max_tokens` or the batch's token budget so the KV cache stops preempting",
                "fix the load balancer's spread if one replica holds the queue",
            ),
        ),
        PhaseGuide(
            "prefill",
            "prompt processing up to the first token",
            (
                "input-token percentiles against last week (longer prompts?)",
                "the prefix-cache hit rate (a changed system prompt stops every hit)",
                "prefill chunks per step: long prompts competing with decode in large batches",
            ),
            (
                "restore the prompt that the prefix cache held, or warm it",
                "cap prompt length per tier; enable chunked prefill so decode is not starved",
                "roll back a model or engine change that made the forward pass slower",
            ),
        ),
        PhaseGuide(
            "queue_prefill",
            "queue and prefill together: the engine's time before the first token when it does "
            "not report the two apart (any engine seen only through the wire)",
            (
                "the engine's own metrics, scraped into the same gauges: requests waiting (queue) "
                "against requests running and KV-cache usage (prefill)",
                "the engine's spans, if it exports them over OTLP (vLLM, SGLang, TGI): they split "
                "time in queue from time in prefill",
                "input-token percentiles: a prompt-length shift grows prefill, not the queue",
            ),
            (
                "waiting requests high: treat it as queue (capacity, shedding)",
                "waiting requests flat: treat it as prefill (prompt length, prefix cache)",
                "export the engine's spans to `slo proxy` (POST /v1/traces) so the next page "
                "names queue or prefill, not both",
            ),
        ),
        PhaseGuide(
            "decode",
            "first token to last token, detokenization excluded",
            (
                "batch size and KV-cache usage (decode is memory-bandwidth bound)",
                "GPU utilization and clocks: a throttling or shared GPU",
                "output-token percentiles: longer answers make longer decodes, not slower tokens",
            ),
            (
                "lower the batch limit while memory-bound",
                "drain a replica whose GPU throttles",
                "roll back a quantization or kernel change",
            ),
        ),
        PhaseGuide(
            "detokenize",
            "turning token ids into text",
            (
                "the tokenizer's version and whether it is the fast (Rust) one",
                "CPU saturation on the replica: detokenizing shares the CPU with the server",
            ),
            ("use the fast tokenizer", "give the replica more CPU, or fewer workers per CPU"),
        ),
        PhaseGuide(
            "other",
            "parsing, tokenizing and validation: the rest of e2e",
            (
                "request sizes (huge JSON bodies, many messages)",
                "CPU saturation and garbage-collection pauses in the app around the engine",
                "a new middleware or validation step in the last deploy",
            ),
            (
                "roll back the app change",
                "give the app more CPU or workers",
                "move tokenization off the event loop",
            ),
        ),
    )
}


def guide(phase: str) -> PhaseGuide:
    """The guide of one phase; a phase without one is an error that names the fix."""
    try:
        return _GUIDES[phase]
    except KeyError:
        raise KeyError(
            f"alerts/phase_guide.py: phase {phase!r} of slo.sli.PHASES has no runbook guide; "
            "add a PhaseGuide for it"
        ) from None


def guides(phases: tuple[str, ...] = PHASES) -> list[PhaseGuide]:
    return [guide(phase) for phase in phases]
