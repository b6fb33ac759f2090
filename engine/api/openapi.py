"""The API's OpenAPI document, served at /openapi.json (clients, fuzzers like schemathesis)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "OpenAI-style error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["message", "type"],
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": ["string", "null"]},
                        },
                    }
                },
            }
        }
    },
}

_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "seed": {"type": "integer"},
    "stop": {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]
    },
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "ignore_eos": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 1, "maximum": 1},
}

_RESPONSES = {
    "200": {
        "description": "completion (JSON) or a stream of server-sent events",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    "400": _ERROR,
    "404": _ERROR,
    "413": _ERROR,
    "429": _ERROR,
    "503": _ERROR,
    "504": _ERROR,
}


def openapi_document(model_name: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llm-slo engine (OpenAI-compatible)",
            "version": "1",
            "description": f"Serves model '{model_name}'.",
        },
        "paths": {
            "/v1/completions": _generation("createCompletion", _completion_request()),
            "/v1/chat/completions": _generation("createChatCompletion", _chat_request()),
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "responses": {
                        "200": {
                            "description": "the served model",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/health": {
                "get": {
                    "operationId": "health",
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "starting"},
                    },
                }
            },
        },
    }


def _generation(operation_id: str, request_schema: dict[str, Any]) -> dict[str, Any]:
    """A generation route: POST of a JSON body, answered in JSON or as server-sent events."""
    return {
        "post": {
            "operationId": operation_id,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request_schema}},
            },
            "responses": _RESPONSES,
        }
    }


def _completion_request() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "integer", "minimum": 0}},
                ]
            },
        },
    }


def _chat_request() -> dict[str, Any]:
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {
                "type": "string",
                "enum": ["system", "developer", "user", "assistant", "tool"],
            },
            "content": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {**_SAMPLING, "messages": {"type": "array", "minItems": 1, "items": message}},
    }
