"""One API key and a keys file naming it, an app that echoes the request body, and one POST
through an ASGI app: the API-key and privacy tests' pieces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from middleware.auth import hash_key

KEY = "sk-llmslo-test-key-0123456789"


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send(
        {
            "type": "http.response.body",
            "body": b'{"echo": ' + json.dumps(message.get("body", b"").decode()).encode() + b"}",
        }
    )


async def call(
    app: Any, headers: dict[str, str], body: bytes = b"{}", path: str = "/v1/completions"
) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    await app(
        {"type": "http", "method": "POST", "path": path, "headers": raw, "state": {}}, receive, send
    )
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def keys_file(tmp_path: Path, **limits: Any) -> Path:
    path = tmp_path / "keys.yaml"
    entry = {"id": "acme", "sha256": hash_key(KEY), "tier": "premium", **limits}
    path.write_text(json.dumps({"keys": [entry]}))
    return path
