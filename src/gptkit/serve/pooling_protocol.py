"""Request bodies of the pooling endpoints, checked field by field as completions' are.

``POST /v1/embeddings`` is OpenAI's protocol: ``input`` is a string, strings, token ids or lists of
them; ``encoding_format`` "float" or "base64" (the official client asks for base64 unless told);
``dimensions`` only at the model's own width. ``POST /v1/classify`` is vLLM's, with ``input`` shaped
by the model's task: one input or an array of them, each an object of the task's fields (the names
`gptkit finetune` reads); a classification model also takes plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptkit.data.examples import OPTIONAL_FIELDS, TEXT_FIELDS
from gptkit.serve.config import ServeLimits
from gptkit.serve.protocol import (
    bad_request,
    check_fields,
    check_text,
    check_user,
    requested_model,
    texts_or_token_ids,
    type_name,
)

_EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
_CLASSIFY_FIELDS = {"model", "input", "user"}


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str | list[int]]
    base64: bool = False  # encoding_format "base64": little-endian float32s, base64-encoded


@dataclass(frozen=True)
class ClassifyRequest:
    model: str
    rows: list[dict[str, str | list[str]]]  # the task's fields of each input


def parse_embedding_request(
    body: Any, limits: ServeLimits, vocab_size: int, dimensions: int
) -> EmbeddingRequest:
    """Check a decoded JSON body for a model of ``dimensions``-wide embeddings; APIError (400) names
    the offending field."""
    model = requested_model(body)
    check_fields(body, _EMBEDDING_FIELDS)
    check_user(body)
    encoding = body.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise bad_request(
            f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", "encoding_format"
        )
    asked = body.get("dimensions")
    if asked is not None and (isinstance(asked, bool) or asked != dimensions):
        raise bad_request(
            f"'dimensions' can only be this model's width, {dimensions}: its embeddings are not "
            f"trained to be shortened, got {asked!r}",
            "dimensions",
            "unsupported_parameter",
        )
    inputs = texts_or_token_ids(body, vocab_size, "input")
    if any(text == "" for text in inputs):
        raise bad_request("'input' cannot contain an empty string", "input")
    _check_count(len(inputs), limits)
    return EmbeddingRequest(model, inputs, encoding == "base64")


def parse_classify_request(body: Any, limits: ServeLimits, task: str) -> ClassifyRequest:
    """Check a decoded JSON body for a fine-tuned model of ``task`` (a :data:`TEXT_FIELDS` key)."""
    model = requested_model(body)
    check_fields(body, _CLASSIFY_FIELDS)
    check_user(body)
    value = body.get("input")
    if value is None:
        raise bad_request("you must provide an 'input' parameter", "input")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise bad_request("'input' must not be an empty array", "input")
    _check_count(len(items), limits)
    return ClassifyRequest(model, [_row(item, i, task) for i, item in enumerate(items)])


def task_input_form(task: str) -> str:
    """What one ``input`` of a ``task`` model is, in words."""
    fields = [f"'{name}'" for name in TEXT_FIELDS[task]]
    fields += [f"optionally '{name}'" for name in OPTIONAL_FIELDS.get(task, ())]
    form = f"an object with {', '.join(fields)}"
    if "choices" in TEXT_FIELDS[task]:
        form += " ('choices': an array of at least two strings; the others strings)"
    return "a string or " + form if task == "classification" else form


def _row(item: Any, index: int, task: str) -> dict[str, str | list[str]]:
    """One input as the task's fields; emptiness is left to the task's own checks (TaskModel.encode)."""
    where = f"'input' item {index}"
    if isinstance(item, str) and task == "classification":
        return {"text": check_text(item, "input")}
    if not isinstance(item, dict):
        raise bad_request(
            f"{where} must be {task_input_form(task)} for this {task} model, got {type_name(item)}", "input"
        )
    required, optional = TEXT_FIELDS[task], OPTIONAL_FIELDS.get(task, ())
    for name in item:
        if name not in required and name not in optional:
            raise bad_request(f"{where} has a field {name!r} that this {task} model does not read", "input")
    row: dict[str, str | list[str]] = {}
    for name in (*required, *optional):
        value = item.get(name)
        if value is None:
            if name in required:
                raise bad_request(
                    f"{where} lacks the field {name!r}: this {task} model reads {task_input_form(task)}",
                    "input",
                )
            continue
        if name == "choices":
            if not isinstance(value, list) or len(value) < 2:
                raise bad_request(f"{where}: 'choices' must be an array of at least two strings", "input")
            row[name] = [check_text(choice, "input") for choice in value]
        else:
            row[name] = check_text(value, "input")
    return row


def _check_count(count: int, limits: ServeLimits) -> None:
    if count > limits.max_queue:
        raise bad_request(
            f"'input' has {count} items; this server queues at most {limits.max_queue} at once", "input"
        )
