"""The server's OpenAPI 3.1 document (``GET /openapi.json``), written from what the endpoints accept
and answer (:mod:`gptkit.serve.protocol`, :mod:`gptkit.serve.pooling_protocol`,
:mod:`gptkit.serve.responses`), with this server's model names and limits filled in.

The request handlers read their bodies themselves (OpenAI's error messages, field by field), so the
document is written here rather than derived from them; tests/test_serve_schema.py sends requests
generated from it (schemathesis) and checks every answer against it.
"""

from __future__ import annotations

import copy
from typing import Any

from gptkit.generation.sampling import MAX_LOGPROBS
from gptkit.serve.config import ServeLimits
from gptkit.serve.models import CHAT_COMPLETIONS, CLASSIFY, COMPLETIONS, EMBEDDINGS
from gptkit.serve.protocol import MAX_STOP_STRINGS

JSON = "application/json"


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _error_responses(*statuses: int) -> dict[str, Any]:
    why = {
        400: "The body is not what this endpoint accepts; the message names the field",
        401: "The API key is missing or wrong",
        404: "No model by that name",
        413: "The body is larger than this server accepts",
        429: "The queue is full; try again",
        499: "The client went away (nobody reads this)",
        503: "The server is shutting down",
        504: "The request ran past the server's time limit",
    }
    out: dict[str, Any] = {}
    for status in statuses:
        content = (
            {} if status == 499 else {"content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}
        )
        out[str(status)] = {"description": why[status], **content}
    return out


def _text_inputs(vocab_size: int) -> dict:
    """OpenAI's prompt/input: a string, strings, token ids, or arrays of token ids."""
    token = {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}
    ids = {"type": "array", "items": token, "minItems": 1}
    return {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ids,
            {"type": "array", "items": ids, "minItems": 1},
        ]
    }


def _request(names: list[str], text: str, texts: dict, **fields: dict) -> dict:
    """A request body: one of the served ``names``, the ``text`` input, ``fields``, ``user``; no others."""
    properties = {"model": {"type": "string", "enum": names}, text: texts, **fields}
    properties["user"] = _nullable({"type": "string"})
    return {
        "type": "object",
        "required": ["model", text],
        "additionalProperties": False,
        "properties": properties,
    }


def _completion_request(names: list[str], limits: ServeLimits, vocab_size: int) -> dict:
    number = {"type": "number"}
    return _request(
        names,
        "prompt",
        _text_inputs(vocab_size),
        **{
            "max_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_tokens_limit}),
            "temperature": _nullable({**number, "minimum": 0, "maximum": 2}),
            "top_p": _nullable({**number, "exclusiveMinimum": 0, "maximum": 1}),
            "top_k": _nullable({"type": "integer", "minimum": 1}),
            "repetition_penalty": _nullable({**number, "exclusiveMinimum": 0, "maximum": 10}),
            "n": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_n}),
            "best_of": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_n}),
            "stream": _nullable({"type": "boolean"}),
            "stream_options": _nullable(
                {
                    "type": "object",
                    "properties": {"include_usage": _nullable({"type": "boolean"})},
                    "additionalProperties": False,
                }
            ),
            "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}),
            "echo": _nullable({"type": "boolean"}),
            "stop": _nullable(
                {
                    "oneOf": [
                        {"type": "string", "minLength": 1},
                        {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1},
                            "minItems": 1,
                            "maxItems": MAX_STOP_STRINGS,
                        },
                    ]
                }
            ),
            "seed": _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
            # Accepted at the values that turn them off only.
            "suffix": _nullable({"type": "string", "maxLength": 0}),
            "presence_penalty": _nullable({"type": "number", "const": 0}),
            "frequency_penalty": _nullable({"type": "number", "const": 0}),
            "logit_bias": _nullable({"type": "object", "maxProperties": 0}),
        },
    )


def _chat_request(names: list[str], limits: ServeLimits, vocab_size: int) -> dict:
    """The completions request with ``messages`` for ``prompt``, and the chat API's own fields."""
    body = _completion_request(names, limits, vocab_size)
    properties = body["properties"]
    for name in ("prompt", "echo", "best_of", "suffix", "logprobs"):
        del properties[name]
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}},
    }
    properties["messages"] = {"type": "array", "items": message, "minItems": 1}
    properties["max_completion_tokens"] = properties["max_tokens"]
    properties["logprobs"] = _nullable({"type": "boolean"})
    properties["top_logprobs"] = _nullable({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS})
    body["required"] = ["model", "messages"]
    return body


def _usage(*names: str) -> dict:
    count = {"type": "integer", "minimum": 0}
    return {"type": "object", "required": list(names), "properties": {name: count for name in names}}


_LOGPROBS = {
    "type": "object",
    "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
    "properties": {
        "tokens": {"type": "array", "items": {"type": "string"}},
        "token_logprobs": {"type": "array", "items": _nullable({"type": "number"})},
        "top_logprobs": {
            "type": "array",
            "items": _nullable({"type": "object", "additionalProperties": {"type": "number"}}),
        },
        "text_offset": {"type": "array", "items": {"type": "integer"}},
    },
}


def _answer(kind: str, items_key: str, item: dict, usage: dict, *, identified: bool = True) -> dict:
    """A response body: its ``object`` kind, an array of ``item`` under ``items_key``, the usage; an
    ``id`` and ``created`` time when ``identified``."""
    named = ["id", "object", "created", "model"] if identified else ["object", "model"]
    properties = {"id": {"type": "string"}, "created": {"type": "integer"}} if identified else {}
    properties.update(object={"const": kind}, model={"type": "string"}, usage=usage)
    properties[items_key] = {"type": "array", "items": item}
    return {"type": "object", "required": [*named, items_key, "usage"], "properties": properties}


def _item(required: list[str], **properties: dict) -> dict:
    index = {"type": "integer", "minimum": 0}
    return {"type": "object", "required": ["index", *required], "properties": {"index": index, **properties}}


_COMPLETION = _answer(
    "text_completion",
    "choices",
    _item(
        ["text", "logprobs", "finish_reason"],
        text={"type": "string"},
        logprobs=_nullable(_LOGPROBS),
        finish_reason={"enum": ["stop", "length"]},
    ),
    _usage("prompt_tokens", "completion_tokens", "total_tokens"),
)
_CHAT_TOKEN = {
    "type": "object",
    "required": ["token", "logprob", "bytes"],
    "properties": {
        "token": {"type": "string"},
        "logprob": _nullable({"type": "number"}),
        "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
    },
}
_CHAT = _answer(
    "chat.completion",
    "choices",
    _item(
        ["message", "logprobs", "finish_reason"],
        message={
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
        },
        logprobs=_nullable(
            {
                "type": "object",
                "required": ["content"],
                "properties": {
                    "content": {
                        "type": "array",
                        "items": {
                            **_CHAT_TOKEN,
                            "properties": {
                                **_CHAT_TOKEN["properties"],
                                "top_logprobs": {"type": "array", "items": _CHAT_TOKEN},
                            },
                        },
                    }
                },
            }
        ),
        finish_reason={"enum": ["stop", "length"]},
    ),
    _usage("prompt_tokens", "completion_tokens", "total_tokens"),
)
_EMBEDDINGS = _answer(
    "list",
    "data",
    _item(
        ["object", "embedding"],
        object={"const": "embedding"},
        embedding={"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
    ),
    _usage("prompt_tokens", "total_tokens"),
    identified=False,
)
_CLASSIFICATION = _answer(
    "list",
    "data",
    _item(
        ["label", "probs", "num_classes"],
        label=_nullable({"type": "string"}),
        probs={"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
        num_classes={"type": "integer", "minimum": 1},
        score={"type": "number"},
    ),
    {"type": "object"},
)

_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "endpoints"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "endpoints": {"type": "array", "items": {"type": "string"}},
    },
}

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
                "param": _nullable({"type": "string"}),
                "code": _nullable({"type": "string"}),
            },
        }
    },
}


def _classify_request(names: list[str], tasks: dict[str, str]) -> dict:
    """Any of the served tasks' inputs: a string (classification), or an object of the task's text fields."""
    text = {"type": "string"}
    row = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **{
                name: text
                for name in ("text", "premise", "hypothesis", "text_a", "text_b", "context", "question")
            },
            "choices": {"type": "array", "items": text, "minItems": 2},
        },
    }
    one = {"anyOf": [text, row]}
    body = _request(names, "input", {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]})
    body["description"] = "Each model's task reads its own fields: " + "; ".join(
        f"{name}: {task}" for name, task in tasks.items()
    )
    return body


def _embedding_request(names: list[str], vocab_size: int, widths: list[int]) -> dict:
    return _request(
        names,
        "input",
        _text_inputs(vocab_size),
        encoding_format=_nullable({"enum": ["float", "base64"]}),
        dimensions=_nullable({"type": "integer", "enum": sorted(set(widths))}),
    )


def _post(summary: str, request: dict, answer: dict, *, stream: bool = False) -> dict:
    content = {JSON: {"schema": answer}}
    if stream:  # server-sent events, one JSON chunk per "data:" line, then "data: [DONE]"
        event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
        content["text/event-stream"] = {"schema": event}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
            "responses": {
                "200": {"description": "The answer", "content": content},
                **_error_responses(400, 401, 404, 413, 429, 499, 503, 504),
            },
        }
    }


# The paths every server has, whatever it serves.
_ALWAYS_PATHS: dict[str, Any] = {
    "/health": {
        "get": {
            "summary": "Whether every model's loop runs",
            "security": [],
            "responses": {
                "200": {
                    "description": "ok, or starting",
                    "content": {
                        JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["status", "model", "models"],
                                "properties": {
                                    "status": {"enum": ["ok", "starting"]},
                                    "model": {"type": "string"},
                                    "models": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        }
                    },
                }
            },
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics",
            "security": [],
            "responses": {
                "200": {
                    "description": "Text exposition",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    },
    "/v1/models": {
        "get": {
            "summary": "The served models",
            "responses": {
                "200": {
                    "description": "OpenAI's model list",
                    "content": {
                        JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["object", "data"],
                                "properties": {
                                    "object": {"const": "list"},
                                    "data": {"type": "array", "items": _MODEL},
                                },
                            }
                        }
                    },
                },
                **_error_responses(401),
            },
        }
    },
    "/v1/models/{name}": {
        "get": {
            "summary": "One served model",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {
                "200": {"description": "OpenAI's model object", "content": {JSON: {"schema": _MODEL}}},
                **_error_responses(401, 404),
            },
        }
    },
}


def openapi_document(models: list, limits: ServeLimits, key_required: bool) -> dict[str, Any]:
    """The document for ``models`` (:class:`gptkit.serve.models.ServedModel`) served with ``limits``;
    ``key_required``: the /v1 endpoints ask for ``Authorization: Bearer KEY``."""

    def serving(endpoint: str) -> list:
        return [model for model in models if endpoint in model.endpoints]

    def vocab(chosen: list) -> int:
        return max((model.gpt.config.total_vocab_size for model in chosen), default=1)

    paths = copy.deepcopy(_ALWAYS_PATHS)  # the caller may change its document
    generators = serving(COMPLETIONS)
    if generators:
        request = _completion_request([m.name for m in generators], limits, vocab(generators))
        paths[COMPLETIONS] = _post("OpenAI's completions", request, _COMPLETION, stream=True)
    chatters = serving(CHAT_COMPLETIONS)
    if chatters:
        request = _chat_request([m.name for m in chatters], limits, vocab(chatters))
        post = _post("OpenAI's chat completions (models with a chat template)", request, _CHAT, stream=True)
        paths[CHAT_COMPLETIONS] = post
    embedders = serving(EMBEDDINGS)
    if embedders:
        widths = [model.gpt.config.d_model for model in embedders]
        request = _embedding_request([m.name for m in embedders], vocab(embedders), widths)
        paths[EMBEDDINGS] = _post("OpenAI's embeddings", request, _EMBEDDINGS)
    classifiers = serving(CLASSIFY)
    if classifiers:
        tasks = {model.name: model.task.spec.task for model in classifiers}
        paths[CLASSIFY] = _post("vLLM's classify", _classify_request(list(tasks), tasks), _CLASSIFICATION)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "gptkit", "version": "1"},
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR}},
    }
    if key_required:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
