"""Screenshots the README shows, written by the tests that check what they picture.

Every run makes them (and checks their size); `LLM_SLO_UPDATE_SCREENSHOTS=1` also writes them
to docs/screenshots/, so the committed pictures are what a passing test saw.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
MAX_BYTES = 200_000


def small_png(png: bytes, max_width: int = 1000, max_height: int | None = None) -> bytes:
    """Cropped to `max_height` (from the top), scaled to `max_width`, 64 colours."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    if max_height is not None and image.height > max_height:
        image = image.crop((0, 0, image.width, max_height))
    if image.width > max_width:
        image = image.resize((max_width, round(image.height * max_width / image.width)))
    buffer = io.BytesIO()
    image.quantize(colors=64).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def keep(png: bytes, name: str, max_width: int = 1000, max_height: int | None = None) -> None:
    """Shrink a screenshot for the README; write it there when asked to."""
    written = small_png(png, max_width, max_height)
    assert len(written) < MAX_BYTES, (name, len(written))
    if os.environ.get("LLM_SLO_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / name).write_bytes(written)
