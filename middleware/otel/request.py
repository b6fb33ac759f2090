"""One finished request in the conventions' terms: what the request body asked for, what the
answer said, and the span name and `gen_ai.*` attributes they make.

Built once per request when it is reported (never per chunk): the body is decoded into a small
msgspec struct that skips every field it does not name (the messages too), so a long prompt
costs a scan, not a parse into objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

import middleware.otel.conventions as c
from middleware.otel.models import MAX_NAME_CHARS, ModelLabels


class RequestBody(msgspec.Struct):
    """The request fields the conventions record; any type is taken, then checked."""

    model: Any = None
    max_tokens: Any = None
    max_completion_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    stream: Any = None
    n: Any = None
    seed: Any = None


_decode_body = msgspec.json.Decoder(RequestBody).decode
EMPTY_BODY = RequestBody()


def read_request_body(body: bytes | bytearray | None) -> RequestBody:
    """The fields of a JSON request body; empty where it is missing or not JSON."""
    if not body:
        return EMPTY_BODY
    try:
        return _decode_body(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return EMPTY_BODY


def operation_for_route(route: str) -> str:
    """`gen_ai.operation.name` of an LLM route: the chat API is `chat`, the rest (the legacy
    completions API and routes a spec adds) `text_completion`."""
    return c.CHAT if "chat" in route else c.TEXT_COMPLETION


_NUMBER_TYPES = (int, float)  # a bool is neither here: `type`, not `isinstance`


def _name(value: Any) -> str | None:
    return value[:MAX_NAME_CHARS] if isinstance(value, str) and value else None


@dataclass(slots=True)
class GenAIRequest:
    """The conventions' view of one finished request."""

    operation: str
    provider: str
    request_model: str | None  # as asked (cut to MAX_NAME_CHARS)
    request_label: str | None  # bounded, for metrics
    response_model: str | None
    response_label: str | None
    response_id: str | None
    finish_reasons: tuple[str, ...]
    error_type: str | None  # the outcome of a failed request, else None
    server_address: str | None
    server_port: int | None
    stream: bool
    body: RequestBody

    @classmethod
    def build(
        cls,
        *,
        route: str,
        provider: str,
        outcome: str,
        body: RequestBody,
        response_model: Any,
        response_id: Any,
        finish_reasons: tuple[str, ...],
        server: Any,
        stream: bool,
        labels: ModelLabels,
    ) -> GenAIRequest:
        request_model = _name(body.model)
        response = _name(response_model)
        request_label = labels.label(request_model)
        host, port = (
            server if isinstance(server, tuple | list) and len(server) == 2 else (None, None)
        )
        return cls(
            operation=operation_for_route(route),
            provider=provider,
            request_model=request_model,
            request_label=request_label,
            response_model=response,
            # Most answers name the model asked for: its label is known.
            response_label=request_label if response == request_model else labels.label(response),
            response_id=_name(response_id),
            finish_reasons=finish_reasons,
            error_type=None if outcome == "ok" else outcome,
            server_address=host if isinstance(host, str) and host else None,
            server_port=port if type(port) is int else None,
            stream=stream,
            body=body,
        )

    @property
    def span_name(self) -> str:
        """`{gen_ai.operation.name} {gen_ai.request.model}`; the operation alone when no model
        was named, or a model nobody listed (span names are indexed by backends: a client
        must not be able to make one per request)."""
        label = self.request_label
        if label is None or label == c.OTHER_MODEL:
            return self.operation
        return f"{self.operation} {label}"

    def span_attributes(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """The conventions' attributes of the request span (`gen_ai.*`, error, server).

        Built for every sampled request: plain tests and stores, no dicts or generators made
        on the way."""
        attributes: dict[str, Any] = {c.OPERATION: self.operation, c.PROVIDER: self.provider}
        if self.request_model is not None:
            attributes[c.REQUEST_MODEL] = self.request_model
        if self.response_model is not None:
            attributes[c.RESPONSE_MODEL] = self.response_model
        if self.response_id is not None:
            attributes[c.RESPONSE_ID] = self.response_id
        if self.error_type is not None:
            attributes[c.ERROR_TYPE] = self.error_type
        if self.server_address is not None:
            attributes[c.SERVER_ADDRESS] = self.server_address
            if self.server_port is not None:
                attributes[c.SERVER_PORT] = self.server_port
        if self.finish_reasons:
            attributes[c.FINISH_REASONS] = self.finish_reasons
        attributes[c.INPUT_TOKENS] = input_tokens
        attributes[c.OUTPUT_TOKENS] = output_tokens
        if self.body is not EMPTY_BODY:
            _sampling_attributes(self.body, attributes)
        if self.stream:  # conditionally required: if and only if the request is streaming
            attributes[c.STREAM] = True
        return attributes


def _sampling_attributes(body: RequestBody, attributes: dict[str, Any]) -> None:
    """The sampling fields the request gave, as the conventions name them: integers (not
    bools) as they came, numbers as floats."""
    max_tokens = body.max_tokens
    if type(max_tokens) is not int:
        max_tokens = body.max_completion_tokens
    if type(max_tokens) is int:
        attributes[c.MAX_TOKENS] = max_tokens
    temperature, top_p = body.temperature, body.top_p
    if type(temperature) in _NUMBER_TYPES:
        attributes[c.TEMPERATURE] = float(temperature)
    if type(top_p) in _NUMBER_TYPES:
        attributes[c.TOP_P] = float(top_p)
    seed = body.seed
    if type(seed) is int:
        attributes[c.SEED] = seed
    choices = body.n
    if type(choices) is int and choices != 1:  # conditionally required: given and != 1
        attributes[c.CHOICE_COUNT] = choices
