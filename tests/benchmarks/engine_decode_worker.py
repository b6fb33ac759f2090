"""One checkout's bundled engine, decoding a batch: run from the checkout's folder with its
PYTHONPATH by tests/benchmarks/test_engine_before_after.py. Prints one JSON line: where its
engine came from, and the decode tokens/s of each round (tokens after each request's first,
over the time from the batch's last first token to its last token).

    python tests/benchmarks/engine_decode_worker.py CHECKPOINT BATCH TOKENS ROUNDS [on|off]

The last argument sets `EngineConfig(blame=...)`; left out, the checkout's default (a
checkout from before blame has no such field)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import engine as engine_package
from engine import Engine, EngineConfig, SamplingParams


async def one_round(engine: Engine, batch: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(index: int) -> None:
        stream = engine.submit(f"decode benchmark request {index}", params, 1, f"r{index}")
        seen = False
        async for _ in stream:
            now = time.perf_counter()
            if not seen:
                firsts.append(now)
                seen = True
            lasts.append(now)

    await asyncio.gather(*(one(index) for index in range(batch)))
    return batch * (tokens - 1) / (max(lasts) - max(firsts))


def main(argv: list[str]) -> None:
    checkpoint, batch, tokens, rounds = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    options: dict[str, Any] = {"device": "cpu", "dtype": "float32", "max_batch_size": batch}
    if len(argv) > 4:
        options["blame"] = argv[4] == "on"
    engine = Engine.from_pretrained(checkpoint, EngineConfig(**options))

    async def run() -> list[float]:
        await engine.start()
        await one_round(engine, batch, tokens)  # warm: allocator, caches
        return [await one_round(engine, batch, tokens) for _ in range(rounds)]

    try:
        rates = asyncio.run(run())
        print(json.dumps({"engine": engine_package.__file__, "tokens_per_s": rates}))
    finally:
        engine.stop_sync()


if __name__ == "__main__":
    main(sys.argv[1:])
