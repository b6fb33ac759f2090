"""How long prefill takes, learned from the steps the engine ran (the slo policy's model)."""

from __future__ import annotations

import math
from collections import deque


class PrefillTimeModel:
    """Step time = base + per_decode * decodes + per_token * prefill tokens, fitted by least
    squares on recent steps.

    A fused step (engine/fused.py) runs its decodes and its prefill chunk in one forward pass,
    so a chunk costs its tokens, not a pass of its own, and the decodes riding along cost what
    they cost whatever the chunk: three parameters, so the prediction for a prompt follows the
    batch it will share steps with. A step's fixed cost (the Python around the forward)
    dominates short chunks; a plain seconds-per-token rate would overestimate small prefills
    and shed requests that could still make their deadline. When the decode count has not
    varied over the window (or the fit gives a negative slope), the decodes fold into the base.
    """

    def __init__(self, window: int = 64, min_samples: int = 8) -> None:
        self._samples: deque[tuple[int, int, float]] = deque(maxlen=window)
        self.min_samples = min_samples
        self.base_s = 0.0
        self.per_token_s = 0.0
        self.per_decode_s = 0.0

    @property
    def ready(self) -> bool:
        """Enough steps seen to predict; before that nothing is shed."""
        return len(self._samples) >= self.min_samples

    def observe(self, prefill_tokens: int, step_s: float, decodes: int = 0) -> None:
        self._samples.append((prefill_tokens, decodes, step_s))
        n = len(self._samples)
        mean_x = sum(x for x, _, _ in self._samples) / n
        mean_d = sum(d for _, d, _ in self._samples) / n
        mean_y = sum(y for _, _, y in self._samples) / n
        sxx = sxd = sdd = sxy = sdy = 0.0
        for x, d, y in self._samples:
            dx, dd, dy = x - mean_x, d - mean_d, y - mean_y
            sxx, sxd, sdd = sxx + dx * dx, sxd + dx * dd, sdd + dd * dd
            sxy, sdy = sxy + dx * dy, sdy + dd * dy
        det = sxx * sdd - sxd * sxd
        per_token, per_decode = 0.0, 0.0
        if sxx > 0 and sdd > 0 and det > 1e-9 * sxx * sdd:
            per_token, per_decode = (sxy * sdd - sdy * sxd) / det, (sdy * sxx - sxy * sxd) / det
        if not (per_token >= 0 and per_decode >= 0) or per_decode == 0:
            per_decode = 0.0  # one regressor: the decodes' cost stays in the base
            if sxx > 0:
                per_token = sxy / sxx
            elif mean_x > 0:
                per_token = mean_y / mean_x
        self.per_token_s = max(0.0, per_token)
        self.per_decode_s = per_decode
        base = mean_y - self.per_token_s * mean_x - per_decode * mean_d
        self.base_s = max(0.0, base)

    def predict_s(self, tokens: int, tokens_per_step: int, decodes: int = 0) -> float:
        """Seconds to prefill `tokens` when each step takes at most `tokens_per_step` of them,
        beside `decodes` running decodes."""
        if tokens <= 0:
            return 0.0
        steps = math.ceil(tokens / max(1, tokens_per_step))
        return steps * (self.base_s + self.per_decode_s * decodes) + tokens * self.per_token_s
