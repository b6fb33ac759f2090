"""Which per-event hot path runs: the compiled `middleware._hotpath` (Cython, built by
`pip install -e .`) unless it is not built or `LLM_SLO_PURE_PYTHON=1` asks for the pure-Python
twin `middleware._hotpath_py`. Chosen once, at import; both behave the same.

    python -c "import middleware.hotpath as h; print(h.IMPLEMENTATION, h.REASON)"

The middleware, the wire parser, the timeline, the histograms and the live windows take their
per-event functions from here (`token_events_in`, `decoded_has_text`, `exchange_send`,
`measured_offer`, `chunk_sent`, `gaps_s`, `bucket_counts`, `window_add`, `timings_comment`,
`observe_values`, `count_in_columns`).
"""

from __future__ import annotations

import os
from types import ModuleType

import middleware._hotpath_py as _hotpath_py

PURE_PYTHON_VARIABLE = "LLM_SLO_PURE_PYTHON"
# The functions each implementation provides, with the same signatures and behaviour.
HOT_FUNCTIONS: tuple[str, ...] = tuple(_hotpath_py.__all__)


def compiled() -> ModuleType | None:
    """The compiled module, or None where it was not built (no C compiler at install)."""
    try:
        import middleware._hotpath as _hotpath  # type: ignore[import-not-found]
    except ImportError:
        return None
    return _hotpath


def _choose() -> tuple[ModuleType, str]:
    if os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0"):
        return _hotpath_py, f"{PURE_PYTHON_VARIABLE}={os.environ[PURE_PYTHON_VARIABLE]}"
    built = compiled()
    if built is None:
        return _hotpath_py, (
            "middleware._hotpath is not built (no C compiler when the package was installed; "
            "reinstall with `pip install -e .` where one is)"
        )
    return built, "middleware._hotpath is built"


impl, REASON = _choose()
# "compiled" or "pure-python".
IMPLEMENTATION: str = impl.IMPLEMENTATION

token_events_in = impl.token_events_in
decoded_has_text = impl.decoded_has_text
exchange_send = impl.exchange_send
measured_offer = impl.measured_offer
chunk_sent = impl.chunk_sent
gaps_s = impl.gaps_s
bucket_counts = impl.bucket_counts
window_add = impl.window_add
timings_comment = impl.timings_comment
observe_values = impl.observe_values
count_in_columns = impl.count_in_columns
