"""/openapi.json for every route: the bare-ASGI /v1/* routes are merged into FastAPI's document.

The proxy answers /v1/chat/completions, /v1/completions and /v1/embeddings before FastAPI, and GET
/v1/models and /metrics are hidden framework routes, so FastAPI cannot see their shapes: they are declared
here as JSON Schema, mirroring core/validation.py (what it checks is constrained; what it passes to the
deployment unchecked is declared as any value). Every error response of every operation is the OpenAI
error object, which is what the gateway sends (FastAPI's own 422 schema is replaced).
"""

import re
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from cache.config import CachePolicy
from core import validation
from routing.config import CascadePolicy, RoutingPolicy

_INT64 = {"minimum": -(2**63), "maximum": 2**63 - 1}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_STATUS_TEXT = {
    400: "Invalid request (malformed JSON, a wrong field, a value out of range)",
    401: "Missing or invalid API key or admin token",
    403: "The key may not use this model, or the admin token is wrong",
    404: "Unknown model, route or resource",
    405: "Method not allowed (the Allow header lists the allowed ones)",
    409: "Conflict with an existing resource",
    413: "Request body (or its decompressed form) too large",
    415: "Unsupported Content-Encoding",
    422: "A field failed validation",
    429: "Rate limit, budget or upstream rate limit; Retry-After says when to retry",
    501: "Not available on this gateway",
    502: "The deployment failed (after retries); the message carries the upstream's",
    503: "No deployment available, or a dependency is down; Retry-After when known",
    504: "The deployment timed out",
}
_PROXY_ERRORS = (400, 401, 403, 404, 413, 415, 429, 502, 503, 504)
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def _nullable(kind: str, **constraints: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], **constraints}


def _sampling() -> dict[str, Any]:
    fields: dict[str, Any] = {
        name: _nullable("number", minimum=low, maximum=high)
        for name, (low, high) in validation.RANGES.items()
    }
    fields |= {name: _nullable("integer", minimum=1, maximum=2**63 - 1) for name in validation.POSITIVE_INTS}
    fields["n"] = _nullable("integer", minimum=1, maximum=validation.MAX_CHOICES)
    fields["min_tokens"] = _nullable("integer", minimum=0, maximum=2**63 - 1)
    json_types = {bool: "boolean", dict: "object", int: "integer", str: "string"}
    fields |= {
        name: _nullable(json_types[kind]) for kind, names in validation.TYPED.items() for name in names
    }
    fields["logit_bias"] = _nullable(
        "object",
        propertyNames={"pattern": "^[0-9]{1,9}$"},
        additionalProperties={"type": "number", "minimum": -100, "maximum": 100},
    )
    fields |= {
        "stream": _nullable("boolean"),
        "stream_options": _nullable("object"),
        "seed": _nullable("integer", **_INT64),
        "stop": {
            "anyOf": [
                {"type": ["string", "null"]},
                {"type": "array", "items": {"type": "string"}, "maxItems": validation.MAX_STOPS},
            ]
        },
        "cache": {
            "type": ["object", "null"],
            "description": "gateway option: skip the cache lookup and/or store",
            "properties": {"no_cache": {"type": "boolean"}, "no_store": {"type": "boolean"}},
            "additionalProperties": False,
        },
    }
    return fields


_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": sorted(validation.ROLES)},
        "content": {"type": ["string", "array", "null"]},
    },
    "anyOf": [  # only an assistant message may leave content out
        {"properties": {"role": {"const": "assistant"}}},
        {"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}},
    ],
}


def _request_schema(endpoint: str) -> dict[str, Any]:
    """Every field the endpoint accepts (others get a 400); unchecked ones may hold any value."""
    properties: dict[str, Any] = dict.fromkeys(sorted(validation.ALLOWED[endpoint]), {})
    properties["model"] = {"type": "string", "minLength": 1, "description": "a model alias"}
    if endpoint == "embeddings":
        properties["input"] = {
            "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1}]
        }
        required = ["model", "input"]
    else:
        properties |= {k: v for k, v in _sampling().items() if k in properties}
    if endpoint == "chat":
        properties["messages"] = {"type": "array", "minItems": 1, "items": _MESSAGE}
        required = ["model", "messages"]
    if endpoint == "completions":
        properties["prompt"] = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1}]}
        required = ["model", "prompt"]
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


def _answer(kind: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {"type": "object", "required": ["index"], "properties": choice},
            },
            "usage": {"type": ["object", "null"]},
        },
    }


_FINISH = {"type": ["string", "null"]}
_RESPONSES: dict[str, dict[str, Any]] = {
    "chat": _answer("chat.completion", {"index": {"type": "integer"}, "message": {"type": "object"},
                                        "finish_reason": _FINISH}),
    "completions": _answer("text_completion", {"index": {"type": "integer"}, "text": {"type": "string"},
                                               "finish_reason": _FINISH}),
    "embeddings": {
        "type": "object",
        "required": ["object", "data", "model"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"type": "object", "required": ["index", "embedding"], "properties": {
                "index": {"type": "integer"},
                "embedding": {"type": ["array", "string"], "description": "floats, or base64"}}}},
            "model": {"type": "string"},
            "usage": {"type": ["object", "null"]},
        },
    },
}  # fmt: skip
_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"], "properties": {
            "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
            "owned_by": {"type": "string"}}}},
    },
}  # fmt: skip
_SUMMARIES = {
    "chat": ("Create a chat completion", "/v1/chat/completions"),
    "completions": ("Create a text completion", "/v1/completions"),
    "embeddings": ("Create embeddings", "/v1/embeddings"),
}
_BEARER = [{"bearer": []}]


def _errors(statuses: tuple[int, ...]) -> dict[str, Any]:
    return {str(s): {"description": _STATUS_TEXT[s], "content": _json_ref("Error")} for s in statuses}


def _json_ref(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def _proxy_operation(endpoint: str) -> dict[str, Any]:
    summary, _ = _SUMMARIES[endpoint]
    name = endpoint.title().replace("_", "")
    ok: dict[str, Any] = {"description": "The answer", "content": _json_ref(f"{name}Response")}
    if endpoint != "embeddings":
        ok["content"]["text/event-stream"] = {
            "schema": {"type": "string"},
            "description": "with stream: true",
        }
    return {
        "post": {
            "summary": summary,
            "tags": ["openai"],
            "operationId": f"create_{endpoint}",
            "security": _BEARER,
            "parameters": [_REQUEST_ID],
            "requestBody": {
                "required": True,
                "description": "JSON; may be sent with Content-Encoding gzip or deflate",
                "content": _json_ref(f"{name}Request"),
            },
            "responses": {"200": ok, **_errors(_PROXY_ERRORS)},
        }
    }


_REQUEST_ID = {
    "name": "x-request-id",
    "in": "header",
    "required": False,
    "description": "kept (and sent upstream) if 1-64 visible ASCII characters; else a new one is made",
    "schema": {"type": "string"},
}


def _hidden_routes() -> dict[str, Any]:
    return {
        "/v1/models": {"get": {
            "summary": "The model aliases this key may use", "tags": ["openai"], "operationId": "list_models",
            "security": _BEARER,
            "responses": {"200": {"description": "The aliases", "content": _json_ref("ModelList")},
                          **_errors((401, 403, 503))},
        }},
        "/metrics": {"get": {
            "summary": "Prometheus metrics", "tags": ["ops"], "operationId": "metrics",
            "responses": {"200": {"description": "Prometheus text format",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}},
        }},
    }  # fmt: skip


def _use_error_shape(schema: dict[str, Any]) -> None:
    """Every 4xx/5xx of FastAPI's operations answers the OpenAI error object; 422 (validation) too."""
    for path, item in schema["paths"].items():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            extra: tuple[int, ...] = ()
            if path.startswith("/admin/"):
                extra = (400, 401, 403, 404, 409, 413, 422)
            elif path.startswith("/v1/"):  # the Responses, Messages and model routes run the pipeline
                extra = _PROXY_ERRORS
            for status in extra:
                responses.setdefault(str(status), {})
            shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
            for status, response in responses.items():
                if status[0] in "45":
                    response["description"] = _STATUS_TEXT.get(int(status), response.get("description", ""))
                    response["content"] = _json_ref(shape)
            if path.startswith("/admin/"):
                operation["security"] = _BEARER


def _policy_sections(schemas: dict[str, Any]) -> None:
    """Policy.cache/routing/cascade are dicts validated as CachePolicy/RoutingPolicy/CascadePolicy: say so."""
    models = [(CachePolicy, "validation"), (RoutingPolicy, "validation"), (CascadePolicy, "validation")]
    refs, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    cache, routing, cascade = (refs[m] for m in models)
    sections = {"cache": cache, "routing": routing,
                "cascade": {"anyOf": [{"type": "object", "maxProperties": 0}, cascade]}}  # fmt: skip
    for name, schema in schemas.items():
        properties = schema.get("properties", {})  # responses echo the sections as stored: left open
        if set(sections) <= set(properties) and "key_limits" in properties and not name.endswith("Out"):
            properties |= sections


_NO_NUL = "^[^\\x00]*$"


def _forbid_nul(node: Any) -> None:
    """Admin strings (and dict keys) may not hold NUL (PostgreSQL refuses it): the schema says so."""
    if isinstance(node, list):
        for item in node:
            _forbid_nul(item)
        return
    if not isinstance(node, dict):
        return
    kinds = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if "string" in kinds and not {"format", "pattern", "enum", "const"} & set(node):
        node["pattern"] = _NO_NUL
    if "object" in kinds and node.get("additionalProperties") not in (None, False):
        node.setdefault("propertyNames", {"pattern": _NO_NUL})
    for key, value in node.items():
        if key not in ("propertyNames", "examples", "default"):
            _forbid_nul(value)


def install_openapi(app: FastAPI) -> None:
    """app.openapi() (and so /openapi.json) returns FastAPI's document with the routes above merged in."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema["paths"] |= {path: _proxy_operation(e) for e, (_, path) in _SUMMARIES.items()}
            schema["paths"] |= _hidden_routes()
            _use_error_shape(schema)
            ready = schema["paths"]["/health/ready"]["get"]["responses"]
            ready["503"] = {"description": "Not ready (a dependency is down or the gateway is stopping)",
                            "content": {"application/json": {"schema": {"type": "object"}}}}  # fmt: skip
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
            schemas = components.setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            _policy_sections(schemas)
            _forbid_nul(schemas)
            _forbid_nul([op.get("parameters", []) for path, item in schema["paths"].items()
                         if path.startswith("/admin/") for op in item.values()])  # fmt: skip
            schemas["Error"] = _ERROR
            schemas["AnthropicError"] = _ANTHROPIC_ERROR
            schemas["ModelList"] = _MODEL_LIST
            for endpoint in _SUMMARIES:
                name = endpoint.title()
                schemas[f"{name}Request"] = _request_schema(endpoint)
                schemas[f"{name}Response"] = _RESPONSES[endpoint]
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def allowed_methods(app: FastAPI, path: str) -> str:
    """The Allow header of a 405: the methods /openapi.json documents for this path."""
    methods: set[str] = set()
    for template, item in app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in item}
    return ", ".join(sorted(methods))
