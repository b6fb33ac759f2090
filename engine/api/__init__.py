"""The engine's OpenAI-compatible HTTP API: `create_app(engine)` and its time `Limits`."""

from engine.api.app import create_app
from engine.api.limits import Limits

__all__ = ["Limits", "create_app"]
