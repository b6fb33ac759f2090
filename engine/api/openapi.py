"""The API's OpenAPI document, served at /openapi.json (clients, fuzzers like schemathesis)."""

from __future__ import annotations

from typing import Any

from engine.api.fields import BY_ROUTE, CHAT_ROLES, Route

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

_RESPONSES = {
    "200": {
        "description": "completion (JSON) or a stream of server-sent events",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    "400": _ERROR,
    "401": _ERROR,  # `slo serve --api-keys`: a missing or unknown key
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
            "/v1/completions": _generation("createCompletion", _completion_request(model_name)),
            "/v1/chat/completions": _generation("createChatCompletion", _chat_request(model_name)),
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "responses": {
                        "200": {
                            "description": "the served model",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                            # The model's name, for the generation routes (and stateful fuzzers).
                            "links": {
                                "ChatWithServedModel": _model_link("createChatCompletion"),
                                "CompleteWithServedModel": _model_link("createCompletion"),
                            },
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


def _model_link(operation_id: str) -> dict[str, Any]:
    return {"operationId": operation_id, "requestBody": {"model": "$response.body#/data/0/id"}}


def _properties(route: Route, model_name: str) -> dict[str, Any]:
    """Every field the route takes (engine/api/fields.py), its disposition in its description."""
    properties: dict[str, Any] = {}
    for name, field in BY_ROUTE[route].items():
        says = (
            field.disposition
            if field.disposition != "refused"
            else f"refused unless {field.accepted}"
        )
        properties[name] = {**field.schema, "description": f"{says}: {field.why}"}
    properties["model"] |= {"enum": [model_name]}  # another name is a 404
    return properties


def _completion_request(model_name: str) -> dict[str, Any]:
    properties = _properties("completions", model_name)
    properties["prompt"] |= {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        ]
    }
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": properties,
        "additionalProperties": False,  # an unknown field is refused
    }


def _chat_request(model_name: str) -> dict[str, Any]:
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": list(CHAT_ROLES)},
            "content": {"type": "string"},
        },
    }
    properties = _properties("chat", model_name)
    properties["messages"] |= {"items": message}
    return {
        "type": "object",
        "required": ["model", "messages"],
        "properties": properties,
        "additionalProperties": False,  # an unknown field is refused
    }
