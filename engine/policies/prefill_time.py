"""How long prefill takes, learned from the steps the engine ran (the slo policy's model)."""

from __future__ import annotations

import math
from collections import deque


class PrefillTimeModel:
    """Step time = base + per_token * prefill tokens, fitted by least squares on recent steps.

    Two parameters, not one rate: a step's fixed cost (the decodes riding along, the Python
    around the forward) dominates short chunks; a plain seconds-per-token rate would
    overestimate small prefills and shed requests that could still make their deadline.
    """

    def __init__(self, window: int = 64, min_samples: int = 8) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.min_samples = min_samples
        self.base_s = 0.0
        self.per_token_s = 0.0

    @property
    def ready(self) -> bool:
        """Enough steps seen to predict; before that nothing is shed."""
        return len(self._samples) >= self.min_samples

    def observe(self, prefill_tokens: int, step_s: float) -> None:
        self._samples.append((prefill_tokens, step_s))
        n = len(self._samples)
        mean_x = sum(x for x, _ in self._samples) / n
        mean_y = sum(y for _, y in self._samples) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in self._samples)
        if var_x > 0:
            cov = sum((x - mean_x) * (y - mean_y) for x, y in self._samples)
            self.per_token_s = max(0.0, cov / var_x)
        elif mean_x > 0:
            self.per_token_s = mean_y / mean_x
        self.base_s = max(0.0, mean_y - self.per_token_s * mean_x)

    def predict_s(self, tokens: int, tokens_per_step: int) -> float:
        """Seconds to prefill `tokens` when each step takes at most `tokens_per_step` of them."""
        if tokens <= 0:
            return 0.0
        steps = math.ceil(tokens / max(1, tokens_per_step))
        return steps * self.base_s + tokens * self.per_token_s
