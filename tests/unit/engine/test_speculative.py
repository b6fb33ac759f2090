"""Speculative decoding: greedy output is plain greedy output; sampled output keeps its law."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, SamplingParams, StepStats  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from engine.sampling import probabilities  # noqa: E402
from engine.speculative import accept_tokens  # noqa: E402
from tests.helpers.checkpoints import checkpoint_fixture, make_engine  # noqa: E402

PROMPTS = [f"request {i}: " + "lorem ipsum " * (i % 4) for i in range(8)]

# chi-square critical values at alpha = 0.001 by degrees of freedom: a correct sampler fails
# with probability 1/1000 for an unlucky seed, and the seeds are fixed.
CHI2_CRITICAL_0001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32,
                      8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26, 12: 32.91, 13: 34.53,
                      14: 36.12, 15: 37.70, 16: 39.25, 17: 40.79, 18: 42.31, 19: 43.82,
                      20: 45.31, 21: 46.80, 22: 48.27, 23: 49.73, 24: 51.18, 25: 52.62,
                      26: 54.05}  # fmt: skip


def chi_square(counts: dict[Any, int], expected: dict[Any, float], total: int) -> tuple[float, int]:
    """Pearson's statistic, cells with an expected count under 5 pooled into one."""
    statistic, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    for cell, probability in expected.items():
        want = probability * total
        if want < 5:
            pooled_observed += counts.get(cell, 0)
            pooled_expected += want
            continue
        statistic += (counts.get(cell, 0) - want) ** 2 / want
        cells += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / max(pooled_expected, 1e-9)
        cells += 1
    assert set(counts) <= set(expected), "a token outside the distribution's support"
    return statistic, cells - 1


target = checkpoint_fixture(seed=7, name="target")
other_draft = checkpoint_fixture(seed=8, name="other_draft", num_hidden_layers=1)


@pytest.fixture(scope="module")
def near_draft(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with noise on every weight: mostly the same top tokens, other probabilities,
    so the sampled rule both keeps and replaces draft tokens."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path_factory.mktemp("near-draft")
    for path in target.iterdir():
        if path.is_file():
            shutil.copy(path, directory / path.name)
    generator = torch.Generator().manual_seed(99)
    for path in directory.glob("*.safetensors"):
        state = load_file(str(path))
        noisy = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
        save_file(noisy, str(path), metadata={"format": "pt"})
    return directory


def complete_all(engine: Engine, prompts: list[str], params: Any, together: bool) -> list[Any]:
    async def scenario() -> list[Any]:
        if together:
            return list(await asyncio.gather(*(engine.complete(p, params) for p in prompts)))
        return [await engine.complete(p, params) for p in prompts]

    return asyncio.run(scenario())


# ---------------------------------------------------------------------- the rule itself
def test_greedy_rule_keeps_the_agreeing_prefix() -> None:
    logits = torch.full((4, 6), -1.0)
    for position, token in enumerate([2, 3, 5, 1]):
        logits[position, token] = 1.0
    greedy = SamplingParams(temperature=0)
    assert accept_tokens([2, 3, 5], None, logits, greedy, None) == [2, 3, 5, 1]
    assert accept_tokens([2, 4, 5], None, logits, greedy, None) == [2, 3]
    assert accept_tokens([0, 3, 5], None, logits, greedy, None) == [2]
    assert accept_tokens([], None, logits[:1], greedy, None) == [2]


def test_accept_resample_rule_preserves_the_target_distribution() -> None:
    """Positions with fixed target laws p_j and a deliberately different draft law q_j: the
    token emitted at each position must follow p_j, whatever the draft proposed."""
    vocab, positions, trials, lookahead = 5, 3, 3000, 2
    generator = torch.Generator().manual_seed(1234)
    target_logits = torch.randn((positions + lookahead + 1, vocab), generator=generator) * 1.5
    draft_logits = torch.randn((positions + lookahead + 1, vocab), generator=generator) * 1.5
    params = SamplingParams(temperature=1.0)
    p = probabilities(target_logits, params)
    q = probabilities(draft_logits, params)
    counts: list[dict[int, int]] = [{} for _ in range(positions)]
    naive: list[dict[int, int]] = [{} for _ in range(positions)]
    for _ in range(trials):
        emitted: list[int] = []
        while len(emitted) < positions:
            start = len(emitted)
            drafts = [
                int(torch.multinomial(q[start + j], 1, generator=generator))
                for j in range(lookahead)
            ]
            naive[start][drafts[0]] = naive[start].get(drafts[0], 0) + 1
            emitted += accept_tokens(
                drafts,
                [q[start + j] for j in range(lookahead)],
                target_logits[start : start + lookahead + 1],
                params,
                generator,
            )
        for position in range(positions):
            counts[position][emitted[position]] = counts[position].get(emitted[position], 0) + 1
    for position in range(positions):
        expected = {token: float(p[position, token]) for token in range(vocab)}
        statistic, dof = chi_square(counts[position], expected, trials)
        assert statistic < CHI2_CRITICAL_0001[dof], (position, statistic, counts[position])
    # The test can fail: the draft's own law (what skipping verification would emit) is
    # far from the target's.
    drafted = sum(naive[0].values())
    statistic, dof = chi_square(naive[0], {t: float(p[0, t]) for t in range(vocab)}, drafted)
    assert statistic > 10 * CHI2_CRITICAL_0001[dof]


# ------------------------------------------------------------------------- in the engine
def agreeing_prefix(proposed: tuple[int, ...], wanted: tuple[int, ...]) -> int:
    """How many leading tokens of `proposed` equal `wanted`'s."""
    for index, (token, target) in enumerate(zip(proposed, wanted, strict=True)):
        if token != target:
            return index
    return len(proposed)


def greedy_acceptance(
    draft: Engine, prompt_ids: list[int], target_ids: tuple[int, ...], lookahead: int
) -> tuple[int, int]:
    """(drafted, accepted) that greedy speculative decoding must count for one request whose
    plain greedy output is `target_ids`: the prefill gives the first token; then each step the
    draft proposes its own greedy continuation of what was emitted (up to `lookahead` tokens,
    never into the last slot), and the prefix that agrees with the target's tokens is kept,
    plus the target's next token."""

    async def continuation(ids: list[int], count: int) -> tuple[int, ...]:
        params = SamplingParams(max_tokens=count, temperature=0, ignore_eos=True)
        return (await draft.complete(ids, params)).token_ids

    async def count() -> tuple[int, int]:
        drafted = accepted = 0
        emitted = 1
        while emitted < len(target_ids):
            proposing = min(lookahead, len(target_ids) - emitted - 1)
            if proposing:
                prefix = list(prompt_ids) + list(target_ids[:emitted])
                proposal = await continuation(prefix, proposing)
                wanted = target_ids[emitted : emitted + proposing]
                agreeing = agreeing_prefix(proposal, wanted)
            else:
                agreeing = 0
            drafted += proposing
            accepted += agreeing
            emitted += agreeing + 1
        return drafted, accepted

    return asyncio.run(count())


@pytest.mark.parametrize("draft_kind", ["same-model", "near-model", "other-model"])
def test_greedy_speculative_equals_plain_greedy(
    target: Path, near_draft: Path, other_draft: Path, draft_kind: str
) -> None:
    draft = {"same-model": target, "near-model": near_draft, "other-model": other_draft}[draft_kind]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    plain = make_engine(target)
    spec = make_engine(target, draft_model=str(draft), num_speculative_tokens=3)
    draft_alone = make_engine(draft)
    steps: list[StepStats] = []
    spec.add_hooks(type("Hooks", (), {"on_step": lambda self, s: steps.append(s)})())
    try:
        expected = [o.token_ids for o in complete_all(plain, PROMPTS, params, together=False)]
        alone = [o.token_ids for o in complete_all(spec, PROMPTS, params, together=False)]
        together = [o.token_ids for o in complete_all(spec, PROMPTS, params, together=True)]
        # max_tokens 1 and 2 leave no room for a draft token: the lookahead shrinks to 0.
        short = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 2)]
        for short_params in short:
            plainly = complete_all(plain, PROMPTS[:2], short_params, together=True)
            got = complete_all(spec, PROMPTS[:2], short_params, together=True)
            assert [o.token_ids for o in got] == [o.token_ids for o in plainly]
        per_request = [
            greedy_acceptance(draft_alone, spec.encode_prompt(prompt), ids, 3)
            for prompt, ids in zip(PROMPTS, expected, strict=True)
        ]
    finally:
        plain.stop_sync()
        spec.stop_sync()
        draft_alone.stop_sync()
    assert alone == expected
    assert together == expected
    drafted = sum(s.spec_draft_tokens for s in steps)
    accepted = sum(s.spec_accepted_tokens for s in steps)
    assert drafted == spec.totals.spec_draft_tokens
    assert accepted == spec.totals.spec_accepted_tokens
    assert sum(s.decode_tokens for s in steps) == spec.totals.decode_tokens
    # Exactly the drafts the rule keeps, counted once per request (the prompts alone, then
    # together; the short requests propose none): a step that dropped good drafts would still
    # emit the greedy tokens, only slower.
    want = tuple(sum(column) for column in zip(*per_request, strict=True))
    assert (drafted, accepted) == (2 * want[0], 2 * want[1]), (draft_kind, per_request)
    if draft_kind == "same-model":
        assert accepted == drafted > 0  # a draft identical to the target is always right
    elif draft_kind == "near-model":
        assert 0 < accepted < drafted  # both branches of the rule, in every run
    assert spec.num_free_blocks == spec.num_blocks


def exact_joint(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, length: int
) -> dict[tuple[int, ...], float]:
    """The exact law of the first `length` sampled tokens, by enumerating the support."""
    cache = PagedKVCache(engine.model_config, 64, 8, engine.dtype, engine.device)

    def next_probs(ids: list[int]) -> torch.Tensor:
        table: list[int] = []
        cache.ensure_capacity(table, len(ids))
        batch, positions = cache.build_batch([table], [0], [len(ids)])
        with torch.inference_mode():
            hidden = engine.model(torch.tensor([ids]), positions, cache.keys, cache.values, batch)
            probs = probabilities(engine.model.logits(hidden[0, -1]), params)
        cache.allocator.free(table)
        return probs

    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        grown: dict[tuple[int, ...], float] = {}
        for prefix, mass in law.items():
            probs = next_probs(prompt_ids + list(prefix))
            for token in probs.nonzero().flatten().tolist():
                grown[(*prefix, token)] = mass * float(probs[token])
        law = grown
    return law


def test_sampled_speculative_output_keeps_the_target_distribution(
    target: Path, near_draft: Path
) -> None:
    """Many seeded requests through the engine with an imperfect draft: the joint law of the first
    three tokens (the second and third come from the accept/resample rule) is the target's."""
    trials = 600
    spec = make_engine(
        target,
        draft_model=str(near_draft),
        num_speculative_tokens=2,
        max_batch_size=128,
        max_waiting=1024,
    )
    try:
        prompt = "the same prompt"
        base = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)
        law = exact_joint(spec, spec.encode_prompt(prompt), base, 3)
        params = [
            SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True, seed=i)
            for i in range(trials)
        ]

        async def scenario() -> list[Any]:
            return list(await asyncio.gather(*(spec.complete(prompt, p) for p in params)))

        outs = asyncio.run(scenario())
    finally:
        spec.stop_sync()
    counts: dict[tuple[int, ...], int] = {}
    for out in outs:
        counts[out.token_ids] = counts.get(out.token_ids, 0) + 1
    statistic, dof = chi_square(counts, law, trials)
    assert statistic < CHI2_CRITICAL_0001[min(dof, 26)], (statistic, dof)
    # Both branches of the rule ran: some drafts were kept, some replaced.
    assert 0 < spec.totals.spec_accepted_tokens < spec.totals.spec_draft_tokens
