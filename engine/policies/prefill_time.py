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
        self._samples: deque[tuple[int, int, float]] = deque()
        self.window = window
        self.min_samples = min_samples
        self.base_s = 0.0
        self.per_token_s = 0.0
        self.per_decode_s = 0.0
        # Running sums over the window, so a step's fit costs the same whatever the window:
        # the token and decode counts' sums are integers, exact, so a regressor that did not
        # vary over the window has a variance of exactly zero; the times' sums are floats,
        # rebuilt from the samples every `window` steps so rounding cannot pile up.
        self._sx = self._sd = self._sxx = self._sxd = self._sdd = 0
        self._sy = self._sxy = self._sdy = 0.0
        self._since_rebuild = 0
        self._stale = False  # steps observed since the last fit

    @property
    def ready(self) -> bool:
        """Enough steps seen to predict; before that nothing is shed."""
        return len(self._samples) >= self.min_samples

    def observe(
        self, prefill_tokens: int, step_s: float, decodes: int = 0, *, fit: bool = True
    ) -> None:
        """One step's cost; `fit=False` leaves the fit for `fit_now` (a reader that asks only
        now and then: the blame, in steps that decode beside a prefill chunk)."""
        samples = self._samples
        x, d, y = prefill_tokens, decodes, step_s
        samples.append((x, d, y))
        self._add(x, d, y, 1)
        if len(samples) > self.window:
            self._add(*samples.popleft(), -1)
        self._since_rebuild += 1
        if self._since_rebuild >= self.window:
            self._rebuild()
        self._stale = not fit
        if fit:
            self._fit()

    def fit_now(self) -> None:
        """Fit the window's steps, if `observe(fit=False)` saw some since the last fit."""
        if self._stale:
            self._stale = False
            self._fit()

    def _add(self, x: int, d: int, y: float, sign: int) -> None:
        self._sx += sign * x
        self._sd += sign * d
        self._sxx += sign * x * x
        self._sxd += sign * x * d
        self._sdd += sign * d * d
        self._sy += sign * y
        self._sxy += sign * x * y
        self._sdy += sign * d * y

    def _rebuild(self) -> None:
        self._sx = self._sd = self._sxx = self._sxd = self._sdd = 0
        self._sy = self._sxy = self._sdy = 0.0
        for x, d, y in self._samples:
            self._add(x, d, y, 1)
        self._since_rebuild = 0

    def _fit(self) -> None:
        """Least squares over the window, from the running sums (centred: n * S_ab - S_a S_b,
        divided by n)."""
        n = len(self._samples)
        sx, sd, sy = self._sx, self._sd, self._sy
        mean_x, mean_d, mean_y = sx / n, sd / n, sy / n
        sxx = (n * self._sxx - sx * sx) / n
        sxd = (n * self._sxd - sx * sd) / n
        sdd = (n * self._sdd - sd * sd) / n
        sxy = self._sxy - sx * mean_y
        sdy = self._sdy - sd * mean_y
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
