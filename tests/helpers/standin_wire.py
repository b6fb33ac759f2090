"""The OpenAI-compatible documents each stand-in engine writes, shaped as vLLM, SGLang and TGI
shape them (sources in tests/helpers/engine_standins.py). Only the shapes: when each document
goes out is the app's business.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


@dataclass(frozen=True)
class Reply:
    engine: str
    route: str  # "chat" or "completions"
    response_id: str
    model: str
    created: int
    prompt_tokens: int
    include_usage: bool


def sse_event(document: dict[str, Any] | str) -> bytes:
    data = document if isinstance(document, str) else json.dumps(document, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def usage(reply: Reply, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": reply.prompt_tokens + completion_tokens,
    }


def _envelope(reply: Reply, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The chunk around `choices`, with each engine's own fields and key order."""
    obj = "chat.completion.chunk" if reply.route == "chat" else "text_completion"
    if reply.engine == "tgi":  # serde: the `object` tag first, empty id, usage written as null
        document: dict[str, Any] = {"object": obj, "id": "", "created": reply.created}
        document |= {"model": reply.model, "system_fingerprint": "3.3.6-native"}
        document["choices"] = choices
        if reply.route == "chat":
            document["usage"] = None
        return document
    document = {"id": reply.response_id, "object": obj, "created": reply.created}
    document |= {"model": reply.model, "choices": choices}
    if reply.engine == "sglang":  # pydantic model_dump_json: unset fields are written as null
        document["usage"] = None
    return document


def _choice(reply: Reply, text: str | None, finish_reason: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0}
    if reply.route == "chat":
        if reply.engine == "tgi":  # every TGI chat chunk repeats the role
            choice["delta"] = {"role": "assistant", "content": text or ""}
        else:
            choice["delta"] = {} if text is None else {"content": text}
    else:
        choice["text"] = text or ""
    choice["logprobs"] = None
    if reply.engine == "tgi" and reply.route == "completions":
        choice["finish_reason"] = finish_reason or ""  # TGI writes "" until the end
    else:
        choice["finish_reason"] = finish_reason
    if reply.engine == "vllm" and reply.route == "completions":
        choice["stop_reason"] = None
    if reply.engine == "sglang":
        choice["matched_stop"] = None
    return choice


def opening(reply: Reply) -> list[dict[str, Any]]:
    """What goes out with the first token, before it: the chat role chunk of vLLM and SGLang
    (`delta: {"role": "assistant", "content": ""}`). TGI and completions have none."""
    if reply.route != "chat" or reply.engine == "tgi":
        return []
    choice = _choice(reply, "", None)
    choice["delta"] = {"role": "assistant", "content": ""}
    return [_envelope(reply, [choice])]


def content(
    reply: Reply, text: str, finish_reason: str | None, completion_tokens: int
) -> dict[str, Any]:
    """One content chunk. vLLM and TGI put the finish reason on the chunk of the last token
    (TGI completions add the usage there too); SGLang chat sends its own finish chunk."""
    own_finish_chunk = reply.engine == "sglang" and reply.route == "chat"
    document = _envelope(reply, [_choice(reply, text, None if own_finish_chunk else finish_reason)])
    if reply.engine == "tgi" and reply.route == "completions" and finish_reason:
        document["usage"] = usage(reply, completion_tokens)
    return document


def closing(reply: Reply, finish_reason: str, completion_tokens: int) -> list[dict[str, Any] | str]:
    """After the last token: SGLang's finish chunk, the usage chunk (`choices: []`) when the
    request asked for it, then `[DONE]`."""
    documents: list[dict[str, Any] | str] = []
    if reply.engine == "sglang" and reply.route == "chat":
        documents.append(_envelope(reply, [_choice(reply, None, finish_reason)]))
    tgi_completions = reply.engine == "tgi" and reply.route == "completions"
    if reply.include_usage and not tgi_completions:
        document = _envelope(reply, [])
        document["usage"] = usage(reply, completion_tokens)
        if reply.engine == "tgi":
            document["id"] = ""
        documents.append(document)
    documents.append(DONE)
    return documents


def plain(reply: Reply, text: str, finish_reason: str, completion_tokens: int) -> dict[str, Any]:
    """The non-streamed body."""
    if reply.route == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    document: dict[str, Any] = {
        "id": reply.response_id,
        "object": obj,
        "created": reply.created,
        "model": reply.model,
        "choices": [choice],
        "usage": usage(reply, completion_tokens),
    }
    if reply.engine == "tgi":
        document = {"object": obj, **document, "system_fingerprint": "3.3.6-native"}
    return document


def tgi_timing_headers(
    total_s: float, queue_s: float, inference_s: float, reply: Reply, completion_tokens: int
) -> dict[str, str]:
    """TGI's non-streamed response headers: times in whole milliseconds (`as_millis`),
    `x-compute-time` in seconds."""
    return {
        "x-compute-type": "gpu+optimized",
        "x-compute-time": str(total_s),
        "x-total-time": str(int(total_s * 1000)),
        "x-validation-time": "0",
        "x-queue-time": str(int(queue_s * 1000)),
        "x-inference-time": str(int(inference_s * 1000)),
        "x-time-per-token": str(int(inference_s * 1000 / completion_tokens)),
        "x-prompt-tokens": str(reply.prompt_tokens),
        "x-generated-tokens": str(completion_tokens),
    }
