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
    completion = {
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
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {**_SAMPLING, "messages": {"type": "array", "minItems": 1, "items": message}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llm-slo engine (OpenAI-compatible)",
            "version": "1",
            "description": f"Serves model '{model_name}'.",
        },
        "paths": {
            "/v1/completions": {
                "post": {
                    "operationId": "createCompletion",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": completion}},
                    },
                    "responses": _RESPONSES,
                }
            },
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": chat}},
                    },
                    "responses": _RESPONSES,
                }
            },
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
