"""Who made premium wait under a batch flood: the bundled engine, fifo scheduling (so premium
queues behind batch) and chunked prefill (so batch prompts ride in premium's decode steps).
At least 90% of premium's queue and interference blame that names a tier names batch; with
premium traffic alone, every tier it names is premium."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from engine import Engine, SamplingParams
from engine.blame import INTERFERENCE, QUEUE
from slo.spec import SLOSpec
from tests.helpers.checkpoints import checkpoint_fixture, make_engine

checkpoint = checkpoint_fixture(seed=5)
SPEC = SLOSpec.default()
PREMIUM, BATCH = SPEC.tiers[0], SPEC.tiers[-1]
NAMES = {PREMIUM.priority: PREMIUM.name, BATCH.priority: BATCH.name}
SHORT = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
FLOOD, PREMIUMS = 12, 4
SHARE = 0.9  # of premium's named queue and interference blame, on batch


class Blames:
    """Each request's blame, by id."""

    def __init__(self) -> None:
        self.by_request: dict[str, Any] = {}

    def on_blame(self, request_id: str, time_ns: int, blame: Any) -> None:
        self.by_request[request_id] = blame


@pytest.fixture
def engine(checkpoint: Path) -> Iterator[Engine]:
    engine = make_engine(
        checkpoint, max_batch_size=4, max_num_batched_tokens=48, scheduling="fifo", warmup=False
    )
    yield engine
    engine.stop_sync()


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


def run(engine: Engine, flood: int, premiums: int = PREMIUMS) -> dict[str, float]:
    """A flood of `flood` batch requests (long prompts, long answers), premium requests coming
    one at a time into it (all at once without a flood, so they wait for each other);
    premium's named queue and interference seconds, by culprit tier."""
    blames = Blames()
    engine.add_hooks(blames)

    async def traffic() -> None:
        await engine.start()
        batch = [
            engine.submit("a long batch prompt " * 12, LONG, BATCH.priority, f"batch-{i}")
            for i in range(flood)
        ]
        draining = [asyncio.ensure_future(_drain(stream)) for stream in batch]
        if flood:
            for index in range(premiums):
                await asyncio.sleep(0.01)
                await _drain(engine.submit("hello", SHORT, PREMIUM.priority, f"premium-{index}"))
        else:
            prompts = ["a premium prompt " * (2 + index) for index in range(premiums)]
            together = [
                engine.submit(prompt, SHORT, PREMIUM.priority, f"premium-{index}")
                for index, prompt in enumerate(prompts)
            ]
            draining += [asyncio.ensure_future(_drain(stream)) for stream in together]
        await asyncio.gather(*draining)

    asyncio.run(traffic())
    caused: dict[str, float] = {}
    for request_id, blame in blames.by_request.items():
        if not request_id.startswith("premium"):
            continue
        for cause, priority, seconds, _ in blame.by_tier:
            if cause in (QUEUE, INTERFERENCE) and priority is not None:
                name = NAMES[priority]
                caused[name] = caused.get(name, 0.0) + seconds
    assert len([r for r in blames.by_request if r.startswith("premium")]) == premiums
    print(f"flood {flood}, premium's named queue and interference blame (s):", caused)
    return caused


def test_under_a_batch_flood_premiums_blame_names_batch(engine: Engine) -> None:
    caused = run(engine, FLOOD)
    total = sum(caused.values())
    assert total > 0, "premium waited for nobody under the flood: the flood proves nothing"
    assert caused.get(BATCH.name, 0.0) >= SHARE * total, caused


def test_premium_alone_blames_only_premium(engine: Engine) -> None:
    caused = run(engine, 0, premiums=3 * PREMIUMS)  # more than the slots: some wait
    assert caused.get(PREMIUM.name, 0.0) > 0 and set(caused) == {PREMIUM.name}, caused
