"""`scope["state"]`'s keys are named once (`middleware.request.state.RequestState`); the bundled
engine's API, which cannot import the middleware, writes out the keys it uses, held to the same
names and types here; and no module reads or writes a key the TypedDict does not name."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import get_type_hints

from engine.api.state import EngineRequestState
from middleware.capture import CaptureBuffer
from middleware.request.state import RequestState

ROOT = Path(__file__).resolve().parents[3]
# `state["key"]`, `state.get("key"`, `state["a"], state["b"] = ...` and `scope["state"]["key"]`.
STATE_KEY = re.compile(r"""state(?:\"\])?(?:\[|\.get\()\s*["']([a-z_]+)["']""")


def _hints(kind: type) -> dict[str, object]:
    return get_type_hints(kind, localns={"CaptureBuffer": CaptureBuffer, "Callable": Callable})


def test_the_engine_uses_the_middlewares_keys_with_their_types() -> None:
    middleware_keys, engine_keys = _hints(RequestState), _hints(EngineRequestState)
    assert engine_keys, "the engine's copy names no key"
    for key, kind in engine_keys.items():
        assert key in middleware_keys, f"the engine uses state[{key!r}], RequestState lacks it"
        assert kind == middleware_keys[key], key


def test_every_key_read_or_written_is_named_in_request_state() -> None:
    named = set(_hints(RequestState))
    used: dict[str, set[str]] = {}
    sources = [*(ROOT / "middleware").rglob("*.py"), *(ROOT / "engine" / "api").rglob("*.py")]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if "state" not in text:
            continue
        for key in STATE_KEY.findall(text):
            used.setdefault(key, set()).add(path.relative_to(ROOT).as_posix())
    # The walk finds the keys the door and the engine's API use (a broken pattern finds none).
    assert {"request_id", "tier", "priority", "outcome", "capture"} <= set(used)
    unnamed = {key: sorted(paths) for key, paths in used.items() if key not in named}
    assert not unnamed, f"scope state keys not in middleware.request.state.RequestState: {unnamed}"


def test_the_pattern_finds_each_spelling() -> None:
    for text in ('state["tier"]', "state.get('outcome')", 'scope["state"]["capture"] = b'):
        assert STATE_KEY.findall(text), text
