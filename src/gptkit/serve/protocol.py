"""OpenAI's completions protocol: request bodies checked field by field, errors in OpenAI's shape.

Every field of OpenAI's legacy ``POST /v1/completions`` is either supported, accepted at the value
that means "off", or refused with a 400 that says why; any other field is refused as OpenAI refuses
unknown parameters ("Unrecognized request argument supplied: ...").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gptkit.generation.sampling import MAX_LOGPROBS, SamplingParams
from gptkit.serve.config import ServeLimits

MAX_STOP_STRINGS = 4  # as OpenAI


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class CompletionRequest:
    """A checked ``/v1/completions`` body. ``prompts`` are strings or lists of token ids."""

    model: str
    prompts: list[str | list[int]]
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    echo: bool = False


# Fields accepted only at the value that turns them off, and why the others are refused.
_NEUTRAL_FIELDS = {
    "suffix": ((None, ""), "suffix (insertion) is not supported by this model"),
    "presence_penalty": (
        (None, 0, 0.0),
        "presence_penalty is not supported: use repetition_penalty (a factor > 1 penalises repeats)",
    ),
    "frequency_penalty": (
        (None, 0, 0.0),
        "frequency_penalty is not supported: use repetition_penalty (a factor > 1 penalises repeats)",
    ),
    "logit_bias": ((None,), "logit_bias is not supported"),
}
_IGNORED_FIELDS = {"user"}  # accepted (a string) and not used
_FIELDS = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "stop",
    "seed",
    "best_of",
    "top_k",
    "repetition_penalty",
    *_NEUTRAL_FIELDS,
    *_IGNORED_FIELDS,
}

_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _integer(body: dict, name: str, default: int | None, low: int | None = None, high: int | None = None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {type_name(value)}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise bad_request(f"'{name}' must be {bounds}, got {value}", name)
    return value


def _number(body: dict, name: str, default: float | None, check, expected: str) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {type_name(value)}", name)
    if not (math.isfinite(value) and check(value)):
        raise bad_request(f"'{name}' must be {expected}, got {value}", name)
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, got {type_name(value)}", name)
    return value


def check_text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string, got {type_name(value)}", name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"'{name}' is not valid Unicode (a lone surrogate at {e.start})", name) from e
    return value


def _token_ids(value: list, vocab_size: int, name: str) -> list[int]:
    if not value:
        raise bad_request(f"'{name}' has an empty list of token ids", name)
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise bad_request(
                f"'{name}' token ids must be integers in 0..{vocab_size - 1}, got {token!r}", name
            )
    return value


def texts_or_token_ids(body: dict, vocab_size: int, name: str = "prompt") -> list[str | list[int]]:
    """OpenAI's text inputs (``prompt``, ``input``): a string, strings, token ids or lists of them."""
    value = body.get(name)
    if value is None:
        raise bad_request(f"you must provide {'an' if name[0] in 'aeiou' else 'a'} '{name}' parameter", name)
    if isinstance(value, str):
        return [check_text(value, name)]
    if not isinstance(value, list) or not value:
        raise bad_request(
            f"'{name}' must be a string, a non-empty array of strings, an array of token ids or an "
            f"array of arrays of token ids, got {type_name(value) if value != [] else 'an empty array'}",
            name,
        )
    if all(isinstance(v, str) for v in value):
        return [check_text(v, name) for v in value]
    if all(isinstance(v, list) for v in value):
        return [_token_ids(v, vocab_size, name) for v in value]
    return [_token_ids(value, vocab_size, name)]


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP_STRINGS:
        raise bad_request(f"'stop' must be a string or an array of 1 to {MAX_STOP_STRINGS} strings", "stop")
    for s in stops:
        if not check_text(s, "stop"):
            raise bad_request("'stop' strings must not be empty", "stop")
    return tuple(stops)


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request("'stream_options' must be an object with only 'include_usage'", "stream_options")
    return _boolean(options, "include_usage")


def requested_model(body: Any) -> str:
    """The ``model`` a decoded JSON body names: what every endpoint reads first."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type_name(body)}")
    model = body.get("model")
    if model is None:
        raise bad_request("you must provide a 'model' parameter", "model")
    return check_text(model, "model")


def check_fields(body: dict, known: set[str]) -> None:
    """Refuse fields an endpoint does not know, as OpenAI does."""
    for name in body:
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")


def check_user(body: dict) -> None:
    """``user`` is accepted (a string) and not used."""
    if body.get("user") is not None:
        check_text(body["user"], "user")


def parse_completion_request(body: Any, limits: ServeLimits, vocab_size: int) -> CompletionRequest:
    """Check a decoded JSON body; raises :class:`APIError` (400) naming the offending field."""
    model = requested_model(body)
    check_fields(body, _FIELDS)
    for name, (neutral, why) in _NEUTRAL_FIELDS.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in neutral) and not (
            name == "logit_bias" and value == {}
        ):
            raise bad_request(why, name, "unsupported_parameter")
    check_user(body)

    n = _integer(body, "n", 1, 1, limits.max_n)
    best_of = _integer(body, "best_of", None)
    if best_of is not None and best_of != n:
        raise bad_request(
            "best_of is not supported (except best_of equal to n)", "best_of", "unsupported_parameter"
        )
    stream = _boolean(body, "stream")
    logprobs = _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    echo = _boolean(body, "echo")
    default = SamplingParams()  # a field the body leaves out: the one default, the library's too
    params = SamplingParams(
        max_tokens=_integer(body, "max_tokens", default.max_tokens, 1, limits.max_tokens_limit),
        temperature=_number(
            body, "temperature", default.temperature, lambda t: 0 <= t <= 2, "between 0 and 2"
        ),
        top_p=_number(body, "top_p", default.top_p, lambda p: 0 < p <= 1, "in (0, 1]"),
        top_k=_integer(body, "top_k", default.top_k, 1),
        repetition_penalty=_number(
            body, "repetition_penalty", default.repetition_penalty, lambda r: 0 < r <= 10, "in (0, 10]"
        ),
        seed=_integer(body, "seed", default.seed, -(2**63), 2**64 - 1),
        logprobs=logprobs,
        prompt_logprobs=echo and logprobs is not None,
        stop=_stop(body),
    )
    prompts = texts_or_token_ids(body, vocab_size)
    if len(prompts) * n > limits.max_queue:
        raise bad_request(
            f"{len(prompts)} prompts x n={n} is {len(prompts) * n} sequences; this server queues at most "
            f"{limits.max_queue} at once",
            "prompt",
        )
    return CompletionRequest(
        model=model,
        prompts=prompts,
        params=params,
        n=n,
        stream=stream,
        include_usage=_include_usage(body, stream),
        echo=echo,
    )


def check_context(prompt_ids: list[int], max_tokens: int, context_length: int) -> None:
    """The prompt and the completion must fit in the model's context (OpenAI's message)."""
    if len(prompt_ids) + max_tokens > context_length:
        raise bad_request(
            f"This model's maximum context length is {context_length} tokens, however you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in your prompt; {max_tokens} for "
            "the completion). Please reduce your prompt; or completion length.",
            "prompt",
            "context_length_exceeded",
        )
