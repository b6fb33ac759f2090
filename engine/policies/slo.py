"""`slo`: scheduling by each tier's TTFT and TPOT objectives.

Prefill is ordered by slack = TTFT deadline - now - predicted prefill time, the time learned
from recent steps (`PrefillTimeModel`); it preempts like `priority`; it sheds a waiting
request once no schedule that serves the higher tiers first lets it meet its TTFT objective
(lowest tier first; see `shed`); and while a tier with a
TPOT objective is decoding, it keeps the steps within that objective: it shrinks the prefill
chunks and decodes the lower tiers' sequences in turns, as many per step as fit. A decode's
cost grows with its context (its keys and values are read every step), so 24 long batch
decodes make one step 50x slower than a short premium one; taking turns costs the batch
little throughput (the same keys are read, over more steps) and bounds premium's ITL.

With fused steps (engine/fused.py, the default) a lower tier's prefill chunk rides along a
TPOT-bound tier's decodes, its size capped so the step stays within the objective. Without
them (speculative decoding, or `fuse_steps` off), while such a tier decodes (or prefills), the
prefill of the tiers below it without a TPOT objective waits (at most
`LOWER_PREFILL_MAX_WAIT_S` in a row; a tier above it never waits): a chunk is a second forward
pass in the step, which costs more than the premium decode itself on a small model, so it
would be the ITL tail. And for `TPOT_TIER_RECENT_S` after such a tier was last seen (or the
server's first step), the steps between its requests stay within `IDLE_STEP_TPOTS` of its TPOT
objective: a request that arrives waits for the step in flight, and a full-budget step beside
every batch decode would land on its TTFT. The two kinds of step (a TPOT-bound tier
decoding, or only recently seen) keep caps of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from engine.policies.base import (
    SHED_TTFT_OUT_OF_REACH,
    WITH_OBJECTIVES,
    PolicySettings,
    StepShape,
    TierObjective,
    by_tier_may_preempt,
    by_tier_victim_key,
)
from engine.policies.prefill_time import PrefillTimeModel

if TYPE_CHECKING:
    from engine.sequence import Sequence

# A step may take this share of the tightest TPOT objective among the decoding sequences (the
# rest is slack for the noise around a step), and prefill always gets at least this many tokens.
TPOT_HEADROOM = 0.5
MIN_CHUNK_TOKENS = 16
# Prefill tokens a step bound by a TPOT objective may take before the step-time model has seen
# enough steps to size it (its first `min_samples` steps): a server's first premium request
# beside a flood would otherwise share an uncapped step (4096 tokens, 140 ms on bundled:tiny,
# its TTFT) and the cap would take steps to halve its way down.
COLD_START_CHUNK_TOKENS = 256
# The smallest step of the lower tiers' decode-context cap (context tokens).
DECODE_CONTEXT_STEP = 1024
MAX_GROWTH = 1.25  # the most a cap grows after one step on time
DECODE_CONTEXT_GROWTH = 256  # context tokens the decode cap grows by after a step on time
# How long after a TPOT-bound tier's last request its step bound still holds: long enough to
# span the gaps between its requests, short enough to give the lower tiers full steps back.
TPOT_TIER_RECENT_S = 10.0
# Between a TPOT-bound tier's requests, a step may take this many of its TPOT objectives, and
# at most this share of its TTFT objective: a request that arrives waits for the step in
# flight, so that step is part of its TTFT (a 69 ms step, 5 TPOTs of 20 ms at the 50% share,
# was most of a 100 ms TTFT objective).
IDLE_STEP_TPOTS = 5.0
IDLE_STEP_TTFT_SHARE = 0.25
# The longest the lower tiers' prefill waits while a TPOT-bound tier decodes (no starvation).
LOWER_PREFILL_MAX_WAIT_S = 0.25
BUSY, IDLE = "busy", "idle"


class SloPolicy:
    """Orders by slack to the TTFT deadline, sheds what cannot make it, and shapes steps to
    the TPOT objective of the tiers that have one."""

    name: ClassVar[str] = "slo"
    help: ClassVar[str] = (
        "by slack to each tier's TTFT objective in --spec, steps sized to its TPOT objective, "
        "requests that can no longer meet their TTFT objective shed with 429, lowest tier first"
    )
    reads_objectives: ClassVar[bool] = True
    default_for: ClassVar[str | None] = WITH_OBJECTIVES
    promise: ClassVar[str] = (
        "each tier's TTFT and TPOT objectives: prefill by slack to the TTFT deadline, steps "
        "kept within the tightest TPOT objective running, and a request that can no longer "
        "meet its TTFT objective shed (429), lowest tier first"
    )

    def __init__(self, settings: PolicySettings | None = None) -> None:
        settings = settings or PolicySettings()
        self.objectives = dict(settings.objectives)
        # Read for every sequence in every step: sets, not a lookup and an attribute each time.
        self._tpot_priorities = frozenset(
            priority
            for priority, objective in self.objectives.items()
            if objective.tpot_s is not None
        )
        self._ttft_priorities = frozenset(
            priority
            for priority, objective in self.objectives.items()
            if objective.ttft_s is not None
        )
        self.default_ttft_s = settings.default_ttft_s
        self.prefill_time = PrefillTimeModel()
        # Steps run decodes and chunks in one forward (engine/fused.py): a chunk rides along.
        self.fused_steps = settings.fused_steps
        self._decodes = 0  # decoding sequences when the step was planned: they share its steps
        self.chunk_cap: int | None = None  # prefill tokens per step while TPOT-bound
        self.decode_context_cap: int | None = None  # lower-tier decode context per step
        # priority -> when last seen; empty until the first step planned, which counts as a
        # sighting of every TPOT-bound tier (see `step_tpot_s`): for TPOT_TIER_RECENT_S a flood
        # that comes before premium's first request does not run full-budget steps (150 ms on
        # bundled:tiny) that request waits on.
        self._tpot_tier_seen_ns: dict[int, int] = {}
        # Which kind of step was planned last (BUSY, IDLE or None), and the caps each kind
        # keeps while the other is in use.
        self._regime: str | None = None
        self._saved_caps: dict[str, tuple[int | None, int | None]] = {}
        self._lower_held_ns: int | None = None  # lower tiers' prefill held back since
        self._tpot_running_priority: int | None = None  # see `holds_prefill`

    # ------------------------------------------------------------ order and preemption
    def ttft_deadline_ns(self, sequence: Sequence) -> int:
        objective = self.objectives.get(sequence.priority)
        ttft_s = objective.ttft_s if objective and objective.ttft_s else self.default_ttft_s
        return sequence.arrival_ns + int(ttft_s * 1e9)

    def rank(self, sequence: Sequence, now_ns: int, tokens_per_step: int) -> tuple[float, int, int]:
        remaining = sequence.num_tokens - sequence.num_cached
        predicted_s = self.prefill_time.predict_s(remaining, tokens_per_step, self._decodes)
        predicted_ns = predicted_s * 1e9
        slack_ns = self.ttft_deadline_ns(sequence) - now_ns - predicted_ns
        return (slack_ns, sequence.priority, sequence.arrival)

    def victim_key(self, sequence: Sequence) -> tuple[int, int]:
        return by_tier_victim_key(sequence)

    def may_preempt(self, waiting: Sequence, running: Sequence) -> bool:
        return by_tier_may_preempt(waiting, running)

    # ------------------------------------------------------------------------ shedding
    def shed(
        self, waiting: list[Sequence], running: list[Sequence], now_ns: int, tokens_per_step: int
    ) -> list[tuple[Sequence, str]]:
        """Waiting requests that no schedule serving the higher tiers first lets meet their
        tier's TTFT objective; the lowest tier first in the list.

        The rule (docs/tier-isolation.md): walk the waiting requests tier by tier, most
        important first, each tier in the policy's order. A request is kept when now + the
        predicted time to prefill what is ahead of it (the prefills already running, every
        request kept so far, itself) is within its deadline; otherwise it is shed
        (`ttft_out_of_reach`) and its work leaves the queue. So a lower tier's work never
        counts against a higher tier: premium is shed only when premium's own queue (and the
        prefills already under way) puts it out of reach, and a lower tier is shed before a
        higher one would be. Nothing is shed before the prefill-time model has seen enough
        steps, nor a request that has already streamed tokens (preempted and waiting again),
        nor one whose tier has no TTFT objective (its work still counts for those after it).
        """
        model = self.prefill_time
        self._decodes = sum(1 for s in running if s.prefilled)
        if not model.ready or not waiting:
            return []
        if not any(self._may_be_shed(s) for s in waiting):
            return []  # most steps under a flood: nobody waiting could be shed, no ranking
        ahead = sum(s.num_tokens - s.num_cached for s in running if not s.prefilled)
        order = sorted(waiting, key=lambda s: (s.priority, self.rank(s, now_ns, tokens_per_step)))
        shed: list[Sequence] = []
        for sequence in order:
            work = sequence.num_tokens - sequence.num_cached
            predicted_ns = model.predict_s(ahead + work, tokens_per_step, self._decodes) * 1e9
            if self._may_be_shed(sequence) and (
                now_ns + predicted_ns > self.ttft_deadline_ns(sequence)
            ):
                shed.append(sequence)
            else:
                ahead += work
        shed.sort(key=lambda s: -s.priority)  # the lowest tier is given up on first
        return [(sequence, SHED_TTFT_OUT_OF_REACH) for sequence in shed]

    def _may_be_shed(self, sequence: Sequence) -> bool:
        """Its tier has a TTFT objective and it has streamed nothing yet."""
        return not sequence.output_ids and sequence.priority in self._ttft_priorities

    # ------------------------------------------------------------------- step shaping
    def shape_step(
        self,
        decoding: list[Sequence],
        prefilling: list[Sequence],
        waiting: list[Sequence],
        now_ns: int,
        step: int,
    ) -> StepShape:
        tpot_s = self.step_tpot_s([*decoding, *prefilling], waiting, now_ns)
        decodes = self.select_decodes(decoding, step, tpot_s)
        return StepShape(tpot_s, decodes, self.prefill_cap(tpot_s, now_ns))

    def step_tpot_s(
        self, running: list[Sequence], waiting: list[Sequence], now_ns: int
    ) -> float | None:
        """The time a step must fit, as a TPOT: the tightest TPOT objective among the
        sequences this step decodes, prefills or keeps waiting (a request being prefilled
        counts, or its first step, its TTFT, would run uncapped); else, while such a tier was
        seen in the last `TPOT_TIER_RECENT_S` (the first step planned counts as seeing every
        one of them: a fresh server expects its tiers), `IDLE_STEP_TPOTS` of its objective or
        `IDLE_STEP_TTFT_SHARE` of its TTFT objective, whichever is less (a bound that also
        holds while a looser TPOT-bound tier decodes: its next request waits for this step).
        Also switches the caps to this kind of step's, and notes the most important TPOT-bound
        tier running (decoding or prefilling), whose lower tiers' prefill waits."""
        seen = self._tpot_tier_seen_ns
        priorities = self._tpot_priorities
        if not seen and priorities:  # the first step: a fresh server expects them
            seen.update(dict.fromkeys(priorities, now_ns))
        bound_running = [s for s in running if s.priority in priorities]
        bound = bound_running + [s for s in waiting if s.priority in priorities]
        self._tpot_running_priority = min((s.priority for s in bound_running), default=None)
        if self._tpot_running_priority is None:
            self._lower_held_ns = None
        for sequence in bound:
            seen[sequence.priority] = now_ns
        present = [tpot for s in bound if (tpot := self.objectives[s.priority].tpot_s)]
        recent_ns = now_ns - int(TPOT_TIER_RECENT_S * 1e9)
        recent = [
            _between_requests_s(objective)
            for priority, seen_ns in seen.items()
            if seen_ns >= recent_ns
            and (objective := self.objectives.get(priority))
            and objective.tpot_s
        ]
        if present:
            self._use_caps(BUSY)
            return min(present + recent)
        if recent:
            self._use_caps(IDLE)
            return min(recent)
        self._use_caps(None)
        return None

    def _use_caps(self, regime: str | None) -> None:
        if regime == self._regime:
            return
        if self._regime is not None:
            self._saved_caps[self._regime] = (self.chunk_cap, self.decode_context_cap)
        self.chunk_cap, self.decode_context_cap = self._saved_caps.get(regime or "", (None, None))
        self._regime = regime

    def holds_prefill(self, sequence: Sequence, now_ns: int) -> bool:
        """Whether `sequence`'s prefill waits in the step planned now: it does while a tier
        of higher priority with a TPOT objective is decoding or prefilling, if its own tier
        has no TPOT objective, and until the lower tiers have waited
        `LOWER_PREFILL_MAX_WAIT_S` in a row (counted from the first prefill held). A more
        important tier never waits for a less important one. With fused steps nothing waits:
        the chunk shares the decodes' forward pass, and the chunk cap keeps the step within
        the TPOT objective."""
        top = self._tpot_running_priority
        if top is None or sequence.priority <= top or self._tpot_bound(sequence):
            return False
        if self.fused_steps:  # a chunk rides along the decodes; the chunk cap sizes it
            return False
        if self._lower_released(now_ns):
            return False
        if self._lower_held_ns is None:
            self._lower_held_ns = now_ns
        return True

    def note_prefill(self, sequence: Sequence) -> None:
        """A chunk of `sequence` was planned: a lower tier's ends its wait; a TPOT-bound
        tier's (a request just admitted) holds the tiers below it from now on, in this step
        too."""
        if not self._tpot_bound(sequence):
            self._lower_held_ns = None
        else:
            top = self._tpot_running_priority
            self._tpot_running_priority = (
                sequence.priority if top is None else min(top, sequence.priority)
            )

    def prefill_cap(self, tpot_s: float | None, now_ns: int) -> int | None:
        """Prefill tokens a step bound by `tpot_s` may take (None: no cap): the cap learned from
        the steps so far, else what the step-time model says fits, else (the model not ready)
        `COLD_START_CHUNK_TOKENS`. The step that
        ends the lower tiers' wait takes as much as a step between premium requests would:
        one 16-token chunk per wait would leave a long prompt minutes behind."""
        if tpot_s is None:
            return None
        if self._regime == BUSY and self._lower_released(now_ns):
            idle_cap = self._saved_caps.get(IDLE, (None, None))[0]
            return None if idle_cap is None else max(idle_cap, self.chunk_cap or 0)
        if self.chunk_cap is not None:
            return self.chunk_cap
        return self.fitted_chunk(tpot_s) or COLD_START_CHUNK_TOKENS

    def fitted_chunk(self, tpot_s: float) -> int | None:
        """The prefill tokens the step-time model says fit a step bound by `tpot_s` beside
        the decodes running now: where a cap starts, rather than the whole budget (a first
        step of 4096 prefill tokens would be the TPOT tail the caps are there to prevent).
        None until the model is ready."""
        model = self.prefill_time
        if not model.ready or model.per_token_s <= 0:
            return None
        room = tpot_s * TPOT_HEADROOM - model.base_s - model.per_decode_s * self._decodes
        return max(MIN_CHUNK_TOKENS, int(room / model.per_token_s))

    def _lower_released(self, now_ns: int) -> bool:
        held = self._lower_held_ns
        return held is not None and now_ns - held >= LOWER_PREFILL_MAX_WAIT_S * 1e9

    def select_decodes(
        self, decoding: list[Sequence], step: int, tpot_s: float | None
    ) -> list[Sequence]:
        """The decodes of this step: every one, except in a step bound by a TPOT objective
        (`tpot_s`, from `step_tpot_s`). Then all of the TPOT-bound tiers', and of the others,
        the longest waiting first, as many as `decode_context_cap` allows (at least one: no
        sequence stops for good). `step` stamps those chosen, so the others go first next
        time."""
        cap = self.decode_context_cap
        if tpot_s is None or cap is None:
            return decoding
        bound = self._tpot_priorities
        # Most steps the cap holds every decode: all of them, in the running order, no sort.
        whole = sum(s.num_tokens for s in decoding if s.priority not in bound)
        if whole <= cap:
            for sequence in decoding:
                sequence.last_decode_step = step
            return decoding
        chosen = [s for s in decoding if s.priority in bound]
        others = sorted((s for s in decoding if s.priority not in bound), key=_last_decoded)
        context = 0
        for sequence in others:
            if context and context + sequence.num_tokens > cap:
                break
            chosen.append(sequence)
            context += sequence.num_tokens
        for sequence in chosen:
            sequence.last_decode_step = step
        return chosen

    def _tpot_bound(self, sequence: Sequence) -> bool:
        return sequence.priority in self._tpot_priorities

    # ---------------------------------------------------------------------- learning
    def after_step(
        self,
        step_s: float,
        tpot_s: float | None,
        decoding: list[Sequence],
        budget: int,
        waiting_decodes: int,
        *,
        prefill_tokens: int | None = None,
    ) -> None:
        """Learn the prefill time from every step that did work (a fit over the window costs
        ~30 us a step, so only this policy, its one reader, pays it), and adjust the caps
        from what a step with TPOT-bound decodes really took, in proportion to how far it
        was from the objective's share (at most halved; the prefill cap grows at most 25%,
        the decode cap by `DECODE_CONTEXT_GROWTH`). Feedback rather than the prefill-time
        model: a step's cost grows with context lengths and with whatever else runs on the
        machine, which a per-token rate does not see. `waiting_decodes`: lower-tier decodes
        left out."""
        if prefill_tokens is not None:
            self.prefill_time.observe(prefill_tokens, step_s, len(decoding))
        if tpot_s is None:
            return
        bound = self._tpot_priorities
        context = sum(s.num_tokens for s in decoding if s.priority not in bound)
        if self.chunk_cap is None or self.decode_context_cap is None:
            start = min(budget, self.fitted_chunk(tpot_s) or COLD_START_CHUNK_TOKENS)
            self.chunk_cap, self.decode_context_cap = start, max(context, DECODE_CONTEXT_STEP)
        # Proportional: a step twice too long halves the caps, a step at half its share
        # grows them by a quarter; the work per step settles where steps meet the target.
        factor = min(MAX_GROWTH, max(0.5, tpot_s * TPOT_HEADROOM / max(step_s, 1e-9)))
        grown = int(self.chunk_cap * factor)
        if factor > 1:
            grown = max(grown, self.chunk_cap + MIN_CHUNK_TOKENS)
        self.chunk_cap = min(budget, max(MIN_CHUNK_TOKENS, grown))
        if factor < 1:
            used = min(context, self.decode_context_cap)
            self.decode_context_cap = max(DECODE_CONTEXT_STEP, int(used * factor))
        elif waiting_decodes:  # growing a cap nothing presses on would only hide a burst
            # Additive: one more long decode can cost more than the whole step's slack, so
            # the cap creeps up and any step over its share cuts it (AIMD, as TCP does).
            self.decode_context_cap += DECODE_CONTEXT_GROWTH


def _between_requests_s(objective: TierObjective) -> float:
    """The step bound, as a TPOT, between a TPOT-bound tier's requests (`step_tpot_s`)."""
    assert objective.tpot_s is not None
    bound = objective.tpot_s * IDLE_STEP_TPOTS
    if objective.ttft_s is not None:
        bound = min(bound, objective.ttft_s * IDLE_STEP_TTFT_SHARE / TPOT_HEADROOM)
    return bound


def _last_decoded(sequence: Sequence) -> int:
    return sequence.last_decode_step
